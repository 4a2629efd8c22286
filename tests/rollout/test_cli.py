"""CI-mode contract of the mutating commands: bad input and missing consent exit 2 before any
host is contacted (the inventory's host address has nothing listening); a host that cannot be
reached exits 6."""

import json

import pytest
import yaml
from typer.testing import CliRunner

from ddops.cli import app

runner = CliRunner()


@pytest.fixture
def env(tmp_path, monkeypatch):
    inventory = tmp_path / "inventory.yaml"
    # 192.0.2.0/24 is TEST-NET-1: never routed, so any connection attempt would fail loudly.
    inventory.write_text(yaml.safe_dump({"hosts": {
        "web-1": {"address": "192.0.2.10", "labels": {"role": "serve"}},
        "web-2": {"address": "192.0.2.11", "labels": {"role": "serve"}},
        # closed: nothing listens on port 1 (refused at once); no ssh_key, so the default keys
        "closed": {"address": "127.0.0.1", "ssh_port": 1}}}))
    monkeypatch.setenv("DDOPS_INVENTORY", str(inventory))
    monkeypatch.setenv("DDOPS_STATE", str(tmp_path / "state"))
    return tmp_path


def invoke(*args):
    result = runner.invoke(app, list(args), input="")  # stdin is not a TTY
    return result, (json.loads(result.stdout) if "--json" in args and result.stdout.strip() else None)


def test_switch_without_yes_and_without_tty_refuses(env):
    result, doc = invoke("switch", "cpu-ar", "--host", "web-1", "--json")
    assert result.exit_code == 2 and doc["exit_code"] == 2 and "pass --yes" in doc["error"]


def test_rollout_without_yes_refuses_before_touching_hosts(env):
    plan = env / "plan.yaml"
    plan.write_text(yaml.safe_dump({"profile": "cpu-ar", "selector": {"role": "serve"}}))
    result, doc = invoke("rollout", str(plan), "--json")
    assert result.exit_code == 2 and "pass --yes" in doc["error"]
    assert not (env / "state" / "rollouts").exists()  # nothing started, nothing recorded


def test_rollout_plan_naming_an_unknown_host_is_bad_input(env):
    plan = env / "plan.yaml"
    plan.write_text(yaml.safe_dump({"profile": "cpu-ar", "hosts": ["web-1", "web-9"]}))
    result, doc = invoke("rollout", str(plan), "--yes", "--json")
    assert result.exit_code == 2
    assert doc["error"] == f"{plan}: hosts: web-9: not in the inventory (known: closed, web-1, web-2)"


def test_rollout_with_unknown_profile_names_it(env):
    plan = env / "plan.yaml"
    plan.write_text(yaml.safe_dump({"profile": "cpu-nope", "hosts": ["web-1"]}))
    result, doc = invoke("rollout", str(plan), "--yes", "--json")
    assert result.exit_code == 2 and "cpu-nope" in doc["error"]


def test_bad_plan_key_in_events_channel_ends_with_a_result_line(env):
    plan = env / "plan.yaml"
    plan.write_text(yaml.safe_dump({"profile": "cpu-ar", "hosts": ["web-1"], "wave": 2}))
    result = runner.invoke(app, ["rollout", str(plan), "--yes", "--json-events"], input="")
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    assert result.exit_code == 2 and lines[-1]["event"] == "result"
    assert lines[-1]["error"].startswith(f"{plan}: wave: unknown key")


def test_shadow_commands_without_a_shadow_are_bad_input(env):
    for command in ("promote", "abort"):
        result, doc = invoke("shadow", command, "--yes", "--json")
        assert result.exit_code == 2 and "no shadow recorded" in doc["error"]
    result, doc = invoke("shadow", "compare", "--json")
    assert result.exit_code == 2 and "no shadow recorded" in doc["error"]


def test_shadow_start_with_unknown_host_is_bad_input(env):
    result, doc = invoke("shadow", "start", "cpu-ddtree", "--host", "web-7", "--yes", "--json")
    assert result.exit_code == 2 and "web-7" in doc["error"]


def test_unreachable_host_exits_6_and_nothing_changed(env):
    result, doc = invoke("switch", "cpu-ar", "--host", "closed", "--yes", "--json")
    assert result.exit_code == 6 and "cannot connect to port 1" in doc["error"]
    assert doc["meaning"] == "host unreachable, nothing changed"
    assert not (env / "state" / "results").exists()
