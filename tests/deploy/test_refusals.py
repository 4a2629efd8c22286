"""Planning checks (ddops.deploy.refusals) on real model files and the real bundled runtime's
--help, run through a local shell instead of SSH (the lab tests in test_lab_refuse.py run the
same path over SSH against a production unit)."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass, field

from ddops.deploy.facts import Facts, UnitState
from ddops.deploy.refusals import refusals, runtime_of
from ddops.deploy.plan import Desired, make_plan
from ddops.remote import Result
from tests.deploy.test_preflight import TARGET, draft_config, write_model


@dataclass
class LocalShell:
    """The slice of ddops.remote.Remote that the checks use, running commands on this machine."""
    cache: dict = field(default_factory=dict)
    calls: list = field(default_factory=list)

    def run(self, command: str, check: bool = True, timeout: float | None = None) -> Result:
        self.calls.append(command)
        done = subprocess.run(["sh", "-c", command], capture_output=True, text=True, timeout=timeout)
        return Result(command, done.returncode, done.stdout, done.stderr)


def unit(*args: str) -> str:
    line = " ".join([sys.executable, "-m", "serving", *args])
    return f"[Unit]\nDescription=t\n[Service]\nExecStart={line}\n"


def models(tmp_path, draft_ids=(1, 2), fc_in=128):
    target = write_model(tmp_path / "t", TARGET, {"embed.weight": [300, 64]})
    draft = write_model(tmp_path / "d", draft_config(draft_ids), {"fc.weight": [64, fc_in]})
    return target, draft


def checks(found) -> list[str]:
    return [r.check for r in found]


def test_a_matching_pair_with_known_flags_has_no_refusals(tmp_path):
    target, draft = models(tmp_path)
    text = unit("--model-path", target, "--speculative-algorithm", "DDTREE",
                "--speculative-draft-model-path", draft, "--port", "30000")
    assert refusals(LocalShell(), text) == []


def test_each_definite_problem_is_a_refusal_naming_its_class(tmp_path):
    target, draft = models(tmp_path, fc_in=192)
    wide = refusals(LocalShell(), unit("--model-path", target, "--speculative-draft-model-path", draft))
    assert checks(wide) == ["draft-target"] and "192" in wide[0].reason
    target, draft = models(tmp_path / "layers", draft_ids=(1, 9))
    layers = refusals(LocalShell(), unit("--model-path", target, "--speculative-draft-model-path", draft))
    assert checks(layers) == ["draft-target"] and "[9]" in layers[0].reason
    gone = refusals(LocalShell(), unit("--model-path", str(tmp_path / "nope"),
                                       "--speculative-draft-model-path", str(tmp_path / "nodraft")))
    assert checks(gone) == ["model-missing", "draft-missing"]
    assert str(tmp_path / "nope" / "config.json") in gone[0].reason


def test_a_flag_the_installed_runtime_does_not_know_is_refused_and_help_runs_once(tmp_path):
    target, _ = models(tmp_path)
    shell = LocalShell()
    text = unit("--model-path", target, "--tool-call-parser", "qwen25")
    [flag] = refusals(shell, text)
    assert flag.check == "flag" and "--tool-call-parser" in flag.reason
    refusals(shell, text)
    assert sum("--help" in c for c in shell.calls) == 1


def test_a_runtime_that_cannot_run_is_refused(tmp_path):
    target, _ = models(tmp_path)
    text = unit("--model-path", target).replace(sys.executable, str(tmp_path / "no-python"))
    [missing] = refusals(LocalShell(), text)
    assert missing.check == "runtime" and "--help` exited 127" in missing.reason


def test_runtime_of_a_module_and_of_an_executable():
    assert runtime_of(["/v/python", "-m", "sglang.launch_server", "--port", "1"]) == \
        ["/v/python", "-m", "sglang.launch_server"]
    assert runtime_of(["/usr/bin/server", "--port", "1"]) == ["/usr/bin/server"]


DESIRED = Desired("u.service", "/etc/systemd/system/u.service", unit("--port", "1"), "/etc/ddops/u.env",
                  "A=1\n", "p", "h")


def test_a_plan_with_refusals_is_refused_only_when_it_would_restart():
    running = Facts("u.service", DESIRED.unit_text, DESIRED.env_text, UnitState(active="active"), None, (), 0)
    same = make_plan(DESIRED, running, ["x"])
    assert same.noop and not same.refused
    changed = make_plan(DESIRED, Facts("u.service", "old", "A=1\n", UnitState(active="active"), None, (), 0),
                        ["x"])
    assert changed.refused
    stopped = Facts("u.service", DESIRED.unit_text, DESIRED.env_text, UnitState(), None, (), 0)
    assert make_plan(DESIRED, stopped, ["x"]).refused
    assert not make_plan(DESIRED, stopped).refused


def test_a_connection_reads_each_checkpoint_file_once(tmp_path):
    """The planning checks, the fit reader and a re-plan under the deploy lock share one reader
    per connection: over SSH every read is a round trip. (Who holds the unit's port is live
    state, read again by each plan.)"""
    from ddops.fit.profile_fit import remote_reader
    full = {**TARGET, "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 512}
    target = write_model(tmp_path / "t", full, {"embed.weight": [300, 64]})
    draft = write_model(tmp_path / "d", draft_config(), {"fc.weight": [64, 128]})
    text = unit("--model-path", target, "--speculative-algorithm", "DDTREE",
                "--speculative-draft-model-path", draft, "--port", "30000")
    shell = LocalShell()
    assert refusals(shell, text) == []
    assert remote_reader(shell)(target).path == target
    assert refusals(shell, text) == []
    assert any("config.json" in c for c in shell.calls)
    files = [c for c in shell.calls if not c.startswith("ss ")]    # who holds the port is read live, each plan
    assert len(files) == len(set(files)), shell.calls
