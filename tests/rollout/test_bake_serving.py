"""The bake watcher against real runtime processes: one healthy, one whose injected fault
(DDOPS_SERVING_FAULTS) fails half of its requests after the first two, as a regression that
appears only after a deploy gate passed. Traffic is the watcher's own probe requests."""

import subprocess
import sys

import httpx
import pytest

from ddops.profile.analysis import AnalysisSpec
from ddops.rollout.fleet.bake import Endpoint, Watcher
from ddops.rollout.fleet.scrape import ScrapeError, read
from tests.conftest import TEST_API_KEY
from tests.rollout.serving_pair import Server, make_checkpoints

KEY = TEST_API_KEY  # both runtimes are started with it (api_key=KEY); the healthy one
# also guards /metrics with it, so the watcher must send it
AUTH = {"Authorization": f"Bearer {KEY}"}
SPEC = AnalysisSpec.model_validate({
    "interval_s": 1.0, "min_requests": 4, "baseline": "unchanged",
    "probe": {"rate_per_s": 4, "max_tokens": 4},
    "checks": [{"metric": "error_ratio", "max": 0.1}, {"metric": "ttft_p95", "max_ratio": 50.0}]})


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    root = tmp_path_factory.mktemp("bake")
    paths = make_checkpoints(root)
    mp = pytest.MonkeyPatch()
    mp.setenv("DDOPS_SERVING_FAULTS", "after=2,error_ratio=0.5")
    faulty = Server(paths["target"], root / "faulty.log", api_key=KEY)
    mp.delenv("DDOPS_SERVING_FAULTS")
    healthy = None
    try:
        faulty.wait_ready()  # before the next picks a free port: two must not race for one
        healthy = Server(paths["target"], root / "healthy.log", "--metrics-require-api-key", api_key=KEY)
        yield {"faulty": faulty, "healthy": healthy.wait_ready()}
    finally:
        mp.undo()
        for server in (faulty, healthy):
            if server is not None:
                server.stop()


def watch(servers, bake_s=8.0):
    records = []
    endpoints = {name: Endpoint(s.url, "tiny", KEY) for name, s in servers.items()}
    watcher = Watcher(SPEC, bake_s, endpoints, lambda host, kind, data: records.append((host, kind, data)))
    return watcher, records


def test_faulty_host_fails_on_error_ratio_against_the_unchanged_host(servers):
    for _ in range(2):  # what a deploy gate sees: the first requests succeed
        ok = httpx.post(servers["faulty"].url + "/v1/chat/completions", timeout=60, headers=AUTH,
                        json={"model": "tiny", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]})
        assert ok.status_code == 200
    watcher, records = watch(servers)
    verdicts = watcher.bake(["faulty"], ["healthy"])
    assert verdicts["faulty"]["passed"] is False
    assert verdicts["faulty"]["reasons"][0].endswith("> max 0.1")
    samples = [d for host, kind, d in records if kind == "sample"]
    judged = samples[-1]
    assert judged["window"]["requests"] >= SPEC.min_requests and judged["verdict"] == "fail"
    assert 0.3 <= judged["window"]["error_ratio"] <= 0.7  # every other request fails
    assert judged["baseline"]["requests"] > 0  # the healthy host was probed over the same window
    assert [k for _, k, _ in records][-1] == "verdict"


def test_healthy_host_passes_and_every_sample_is_recorded(servers):
    with pytest.raises(ScrapeError, match="HTTP 401"):
        read(servers["healthy"].url)  # without its key
    watcher, records = watch({"healthy": servers["healthy"]}, bake_s=4.0)
    verdicts = watcher.bake(["healthy"], [])
    assert verdicts == {"healthy": {"status": "passed", "passed": True, "reasons": []}}
    samples = [d for _, kind, d in records if kind == "sample"]
    assert len(samples) == 4 and samples[-1]["window"]["requests"] >= SPEC.min_requests
    # no errors; a window no probe has finished in yet has no ratio (scrape.py): the first, on a slow machine
    assert [s["window"]["error_ratio"] for s in samples] == [0.0 if s["window"]["requests"] else None for s in samples]


def test_malformed_fault_setting_stops_the_runtime_with_one_line(tmp_path_factory):
    paths = make_checkpoints(tmp_path_factory.mktemp("bad-fault"))
    done = subprocess.run([sys.executable, "-m", "serving", "--model-path", str(paths["target"]),
                           "--device", "cpu"], env={"DDOPS_SERVING_FAULTS": "after=x", "PATH": "/usr/bin"},
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and "DDOPS_SERVING_FAULTS: after: not a number" in done.stderr
