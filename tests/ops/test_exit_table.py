"""Exit codes as a table: every command that reaches a host, times every cause this machine can
make in milliseconds (a host the inventory lacks and an ssh key file that is missing: bad input;
a closed loopback port: unreachable), answered with one code and its meaning, and under --json
with one envelope. The causes that need a live host are lab tests beside their commands: lock
held, a failed revert, a gate failed and reverted (tests/deploy/test_lab_deploy.py), SSH lost
mid-change (test_lab_ssh_loss.py), a command that exits non-zero (test_lab_deploy.py). Below
the table, every exception ddops raises for a cause is checked against the one mapping."""

from __future__ import annotations

import json

import pytest
import yaml
from typer.testing import CliRunner

from ddops import exits
from ddops.cli import app
from ddops.shell import Envelope

runner = CliRunner()

HOST_COMMANDS = {   # name -> argv with {h} for the host; --json is added where the command has it
    "status": ["status", "--host", "{h}"],
    "logs": ["logs", "--host", "{h}", "--unit", "ddx.service"],
    "history": ["history", "--host", "{h}"],
    "rollback": ["rollback", "--host", "{h}", "--yes"],
    "diagnose": ["diagnose", "--host", "{h}", "--unit", "ddx.service"],
    "deploy": ["deploy", "cpu-ar", "--host", "{h}", "--yes"],
    "adopt": ["adopt", "--host", "{h}", "--unit", "ddx.service"],
    "preflight": ["preflight", "cpu-ar", "--host", "{h}"],
    "fit": ["fit", "cpu-ar", "--host", "{h}"],
    "push-model": ["push-model", "{models}", "--host", "{h}"],
    "switch": ["switch", "cpu-ar", "--host", "{h}", "--yes"],
    "shadow start": ["shadow", "start", "cpu-ar", "--host", "{h}", "--yes"],
    "hosts trust": ["hosts", "trust", "{h}", "--yes"],
    "rollout": ["rollout", "{plan}", "--yes"],
}
NO_JSON = {"hosts trust"}
CAUSES = {          # cause -> (inventory host, exit code)
    "unreachable": ("closed", exits.UNREACHABLE),
    "not in the inventory": ("nowhere", exits.BAD_INPUT),
    "ssh key missing": ("keyless", exits.BAD_INPUT),
}
EXCEPT = {("hosts trust", "ssh key missing"): exits.UNREACHABLE}   # trust reads the key without logging in


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    folder = tmp_path_factory.mktemp("exits")
    (folder / "model").mkdir()
    (folder / "model" / "config.json").write_text("{}")
    # port 1 on loopback: nothing listens, the connection is refused at once
    closed = {"address": "127.0.0.1", "ssh_port": 1}
    (folder / "inventory.yaml").write_text(yaml.safe_dump({"hosts": {
        "closed": closed, "keyless": {**closed, "ssh_key": str(folder / "no-such-key")}}}))
    for host, _ in CAUSES.values():
        (folder / f"plan-{host}.yaml").write_text(yaml.safe_dump({"profile": "cpu-ar", "hosts": [host]}))
    return folder


def run(world, monkeypatch, command: str, host: str, as_json: bool):
    monkeypatch.setenv("DDOPS_INVENTORY", str(world / "inventory.yaml"))
    monkeypatch.setenv("DDOPS_STATE", str(world / "state"))
    argv = [a.format(h=host, models=world / "model", plan=world / f"plan-{host}.yaml") for a in HOST_COMMANDS[command]]
    return runner.invoke(app, [*argv, *(["--json"] if as_json else [])], input="")


TABLE = [(c, cause) for c in HOST_COMMANDS for cause in CAUSES]


@pytest.mark.parametrize("command, cause", TABLE, ids=[f"{c} x {cause}" for c, cause in TABLE])
def test_every_host_command_exits_with_its_causes_code(world, monkeypatch, command, cause):
    host, code = CAUSES[cause]
    code = EXCEPT.get((command, cause), code)
    done = run(world, monkeypatch, command, host, as_json=False)
    assert done.exit_code == code, done.output
    assert "Traceback" not in done.output
    if command in NO_JSON:
        return
    doc = run(world, monkeypatch, command, host, as_json=True)
    assert doc.exit_code == code, doc.output
    envelope = json.loads(doc.stdout)     # one document, nothing else on stdout
    Envelope.model_validate(envelope)
    assert (envelope["exit_code"], envelope["ok"], envelope["meaning"]) == (code, False, exits.MEANING[code])
    # one line says why: the error, or for a rollout each host's detail
    assert envelope["error"] or all(h["detail"] for h in envelope["hosts"].values()), envelope
    if code == exits.UNREACHABLE:
        assert "cannot connect to port 1" in json.dumps(envelope)


def causes_raised() -> list[tuple[BaseException, int]]:
    """One instance of every exception class ddops raises for a cause, with the code it must end in."""
    from ddops.checkpoint import PreflightError
    from ddops.deploy.adopt import AdoptError
    from ddops.deploy.recover import RecoveryFailed
    from ddops.deploy.lock import LockHeld
    from ddops.deploy.ops import OpsError
    from ddops.fit.model import ModelFactsError
    from ddops.lab.errors import LabError, LabUsageError, NotRootError
    from ddops.profile.yamlfile import ConfigError
    from ddops.remote import BadSetup, CommandFailed, ConnectionLost, Unreachable
    from ddops.report.build import ReportError
    from ddops.rollout.fleet.notify import NotifyError
    from ddops.rollout.fleet.waves import PlanError
    from ddops.rollout.shadow.compare import SettingsError
    from ddops.rollout.shadow.prompts import PromptFileError
    from ddops.exits import BadInput
    bad = [BadInput("x"), ConfigError(["x"]), OpsError("x"), AdoptError("x"), PreflightError("x"),
           ModelFactsError("x"), PlanError("x"), PromptFileError("x"), SettingsError("x"), NotifyError("x"),
           ReportError("x"), LabUsageError("x"), NotRootError("x"), BadSetup("h: ssh key k: no such file")]
    return [*((e, exits.BAD_INPUT) for e in bad),
            (Unreachable("h: cannot connect to port 22"), exits.UNREACHABLE),
            (ConnectionLost("h: `true`: connection lost"), exits.NEEDS_OPERATOR),
            (CommandFailed("h: `false` exited 1: no"), exits.NEEDS_OPERATOR),
            (RecoveryFailed("h: unfinished deploy could not be recovered"), exits.NEEDS_OPERATOR),
            (LabError("lab-1: systemd is degraded after boot"), exits.NEEDS_OPERATOR),
            (LockHeld("h", {"user": "alice"}), exits.LOCKED),
            (KeyError("a bug"), exits.INTERNAL)]


@pytest.mark.parametrize("exc, code", causes_raised(), ids=lambda v: type(v).__name__ if isinstance(v, BaseException) else str(v))
def test_every_cause_ddops_raises_maps_to_one_code(exc, code):
    from ddops.shell import classify
    assert exits.code_of(exc) == code
    assert classify(exc)[0] == code and classify(exc)[2] is (code != exits.INTERNAL)


def test_a_command_that_exited_non_zero_is_not_a_lost_connection():
    from ddops.inventory import Host
    from ddops.remote import CommandFailed, ConnectionLost, Remote
    remote = Remote(Host(name="h", address="192.0.2.1"), connection=None)
    assert remote.lost(ConnectionLost("h: connection lost")) is True
    assert remote.lost(CommandFailed("h: `false` exited 1: no")) is False


def test_several_hosts_end_with_the_most_serious_code():
    assert exits.worst([]) == exits.OK
    assert exits.worst([exits.OK, exits.UNREACHABLE, exits.FAILED]) == exits.UNREACHABLE
    assert exits.worst([exits.UNREACHABLE, exits.NEEDS_OPERATOR, exits.LOCKED]) == exits.NEEDS_OPERATOR


def test_logs_json_prints_the_envelope_and_follow_with_json_is_bad_input(world, monkeypatch):
    monkeypatch.setenv("DDOPS_INVENTORY", str(world / "inventory.yaml"))
    done = runner.invoke(app, ["logs", "--host", "closed", "--follow", "--json"], input="")
    assert done.exit_code == exits.BAD_INPUT and "--follow" in json.loads(done.stdout)["error"]
