"""Rollouts that watch, on real lab hosts through the `ddops` CLI as CI runs it (no TTY):
a canary whose error ratio regresses after its gate passed is halted during its bake and
reverted, webhooks hear every event in order (a dead one changes nothing), and a rollout
paused after its canary continues with --approve and reverts with --abort."""

from __future__ import annotations

import json

import pytest
import yaml

from ddops.render import read_header
from tests.rollout import lab_models
from tests.rollout.test_lab_rollout import Ctx, write
from tests.rollout.webhook_receiver import Receiver
from tests.server_process import free_port

pytestmark = pytest.mark.lab
HOSTS = ["lab-1", "lab-2"]


@pytest.fixture(scope="module")
def lab(lab_hosts, tmp_path_factory, cache_dir):
    models = lab_models.build(cache_dir)
    for host in HOSTS:
        path = models["tiny-llama"]
        pushed = lab_hosts.ddops("push-model", str(path), "--host", host,
                                 "--dest", "/var/lib/ddops/models/tiny-llama")
        assert pushed.returncode == 0, pushed.stdout + pushed.stderr
    root = tmp_path_factory.mktemp("watch-lab")
    profiles = root / "profiles"
    profiles.mkdir()
    # Serves the gate's smoke request (the gate's only request the faults count), then fails
    # every other request: a regression no gate can see, in every request of the bake's window.
    write(profiles, "wt-faulty", """\
        extends: cpu-ar
        service:
          environment: {DDOPS_SERVING_FAULTS: "after=1,error_ratio=0.5"}
        """)
    write(profiles, "wt-plain", """\
        extends: cpu-ar
        service:
          environment: {DDOPS_TEST_TAG: "plain-2"}
        """)
    ctx = Ctx(lab_hosts, root)
    for host in HOSTS:
        ctx.deploy("cpu-ar", host)
    return ctx


def plan(tmp_path, name, **fields):
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump({"hosts": HOSTS, "canary": 1, "wave_size": 1, **fields}))
    return str(path)


def test_canary_regressing_after_its_gate_is_halted_during_bake_and_reverted(lab, tmp_path):
    dead = f"http://127.0.0.1:{free_port()}/hook"
    analysis = {"interval_s": 2, "min_requests": 4, "baseline": "unchanged",
                "probe": {"rate_per_s": 2, "max_tokens": 4},
                "checks": [{"metric": "error_ratio", "max": 0.1}, {"metric": "ttft_p95", "max_ratio": 20}]}
    with Receiver() as receiver:
        path = plan(tmp_path, "faulty", profile=lab.profile("wt-faulty"), bake_s=30, analysis=analysis,
                    notify=[{"url": receiver.url + "/chat", "format": "slack"}, {"url": dead},
                            {"url": receiver.url + "/json"}])
        doc = lab.json("rollout", path, "--yes", expect=1)
    assert doc["status"] == "halted"
    assert doc["hosts"]["lab-1"]["status"] == "failed" and doc["hosts"]["lab-2"]["status"] == "pending"
    assert doc["hosts"]["lab-1"]["detail"].startswith("analysis failed: error_ratio")
    for host in HOSTS:  # the canary is back on what it ran; the other host was never touched
        assert read_header(lab.unit(host))["profile"] == "cpu-ar"
        assert lab.info(host)["status"] == "ok"
    record = doc["analysis"]["lab-1"]
    assert record["verdict"]["status"] == "failed"
    failing = record["samples"][-1]
    window = failing["window"]
    # the faults start right after the gate, so wherever the sample falls in the probe sequence
    # every second request of its window failed (4 requests read 2, 5 read 2, never 1 in 4)
    assert failing["verdict"] == "fail" and window["requests"] >= 4
    assert window["errors"] == window["requests"] // 2 and window["error_ratio"] >= 0.4
    assert failing["baseline"]["requests"] > 0  # lab-2, probed over the same window
    assert len(record["samples"]) < 30 / 2  # halted during the bake, not after it
    kinds = [body["event"] for path, body in receiver.received if path == "/json"]
    assert kinds == ["start", "wave", "analysis", "revert", "wave_done", "halt", "finish"]
    chat = [body["text"] for path, body in receiver.received if path == "/chat"]
    assert len(chat) == len(kinds) and "lab-1 failed" in chat[2]
    chat_report, dead_report, json_report = doc["notifications"]  # in the plan's order
    assert dead_report["sent"] == 0 and len(dead_report["failed"]) == len(kinds)
    assert chat_report["sent"] == json_report["sent"] == len(kinds)
    result = tmp_path / "rollout.json"
    result.write_text(json.dumps(doc))
    reported = lab.ddops("report", str(result))
    page = (tmp_path / "rollout.html").read_text()
    assert reported.stdout.strip() == str(tmp_path / "rollout.html") and "Analysis of lab-1" in page
    figures = [(round(s["time"] - record["samples"][0]["time"], 1), s["window"].get("requests"),
                s["window"].get("error_ratio"), s["verdict"]) for s in record["samples"] if "window" in s]
    print(f"\nlab-1 samples (s, requests, error_ratio, verdict): {figures}; report: {result.with_suffix('.html')}")


def test_paused_rollout_continues_with_approve_and_reverts_with_abort(lab, tmp_path):
    forward = plan(tmp_path, "forward", profile=lab.profile("wt-plain"), pause_after="canary")
    paused = lab.json("rollout", forward, "--yes", expect=5)
    assert paused["status"] == "paused" and paused["paused_at"] == 0
    assert {h: s["status"] for h, s in paused["hosts"].items()} == {"lab-1": "done", "lab-2": "pending"}
    assert read_header(lab.unit("lab-2"))["profile"] == "cpu-ar"
    again = lab.json("rollout", forward, expect=5)  # no --yes needed to ask; nothing changes
    assert again["status"] == "paused" and again["hosts"] == paused["hosts"]

    approved = lab.json("rollout", forward, "--approve", expect=0)
    assert approved["status"] == "succeeded" and approved["resumed"] is True
    for host in HOSTS:
        assert read_header(lab.unit(host))["profile"] == "wt-plain"

    back = plan(tmp_path, "back", profile="cpu-ar", pause_after="canary")
    assert lab.json("rollout", back, "--yes", expect=5)["status"] == "paused"
    assert read_header(lab.unit("lab-1"))["profile"] == "cpu-ar"
    aborted = lab.json("rollout", back, "--abort", expect=1)
    assert aborted["status"] == "aborted"
    assert aborted["hosts"]["lab-1"]["status"] == "reverted" and aborted["hosts"]["lab-2"]["status"] == "pending"
    for host in HOSTS:  # the canary is back on the approved profile
        assert read_header(lab.unit(host))["profile"] == "wt-plain"
        assert lab.info(host)["status"] == "ok"
    refused = lab.ddops("rollout", back, "--approve", "--json")
    assert refused.returncode == 2 and "no paused rollout" in json.loads(refused.stdout)["error"]
