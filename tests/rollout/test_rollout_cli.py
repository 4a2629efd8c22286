"""`ddops rollout` end to end on hosts that cannot be reached (the first deploy finds its host
unreachable and the rollout halts with exit 6, nothing changed): the event stream, the saved state, and what is refused before any host is
contacted. The lab tests (test_lab_watch.py) run the same command on real hosts."""

import json

import pytest
import yaml
from typer.testing import CliRunner

from ddops.cli import app
from tests.rollout.webhook_receiver import Receiver
from tests.server_process import free_port


@pytest.fixture
def fleet(tmp_path, monkeypatch):
    inventory = tmp_path / "inventory.yaml"
    closed = free_port()
    inventory.write_text(yaml.safe_dump({"hosts": {h: {"address": "127.0.0.1", "ssh_port": closed}
                                                   for h in ("h1", "h2")}}))
    monkeypatch.setenv("DDOPS_STATE", str(tmp_path / "state"))
    monkeypatch.setenv("DDOPS_INVENTORY", str(inventory))

    def plan(**fields):
        path = tmp_path / "plan.yaml"
        path.write_text(yaml.safe_dump({"profile": "cpu-ar", "hosts": ["h1", "h2"], "canary": 1,
                                        "wave_size": 1, **fields}))
        return str(path)
    return plan


def run(*args):
    result = CliRunner().invoke(app, ["rollout", *args])
    return result.exit_code, [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]


def test_events_and_webhooks_follow_the_rollout_in_order(fleet):
    with Receiver() as receiver:
        code, lines = run(fleet(bake_s=5, analysis={"checks": [{"metric": "error_ratio", "max": 0.1}]},
                                notify=[{"url": receiver.url}]), "--yes", "--json-events")
    kinds = [e["event"] for e in lines if e["event"] not in ("stage", "host")]
    assert code == 6 and kinds == ["start", "wave", "wave_done", "halt", "finish", "result"]  # unreachable, nothing changed
    result = lines[-1]
    assert result["status"] == "halted" and result["hosts"]["h2"]["status"] == "pending"
    assert result["analysis"]["h1"]["baseline"]["error"].startswith("http://127.0.0.1:30000/metrics")
    assert [b["event"] for _, b in receiver.received] == kinds[:-1]
    assert result["notifications"][0]["sent"] == 5
    assert [e.get("event") or e["status"] for e in result["timeline"]] == \
        ["start", "wave", "running", "unreachable", "wave_done", "halt", "finish"]


@pytest.mark.parametrize("fields, flags, message", [
    ({}, ["--approve"], "--approve: no paused rollout of this plan"),
    ({}, ["--abort", "--restart"], "choose one"),
    ({"analysis": {"checks": [{"metric": "ttft_p95", "max_ratio": 2}]}}, ["--yes"], "analysis: needs bake_s > 0"),
    ({"notify": [{"url_env": "DDOPS_TEST_UNSET_HOOK"}]}, ["--yes"], "DDOPS_TEST_UNSET_HOOK is not set"),
    ({"pause_after": [2]}, ["--yes"], "pause_after: 2: no wave after it"),
])
def test_refused_before_any_host_is_contacted(fleet, fields, flags, message):
    code, lines = run(fleet(**fields), *flags, "--json-events")
    assert code == 2 and message in lines[-1]["error"]
    assert not [e for e in lines if e.get("event") == "host"]


def test_profile_rollout_policy_supplies_analysis_and_pauses(fleet, tmp_path):
    profile = tmp_path / "watched.yaml"
    profile.write_text(yaml.safe_dump({"extends": "cpu-ar", "rollout": {
        "bake_s": 10, "pause_after": ["canary"],
        "analysis": {"checks": [{"metric": "itl_p95", "max_ratio": 1.5}]}}}))
    code, lines = run(fleet(profile=str(profile)), "--yes", "--json-events")
    start = next(e for e in lines if e["event"] == "start")
    assert code == 6 and [c["metric"] for c in start["checks"]] == ["itl_p95"]
    code, lines = run(fleet(profile=str(profile), pause_after=[3]), "--yes", "--json-events")
    assert code == 2 and "pause_after: 3" in lines[-1]["error"]  # the plan's own replaces the profile's
