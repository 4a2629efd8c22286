"""A real Prometheus (Debian's) scrapes a real bundled runtime on loopback through the files
`ddops monitor render` writes, key file included, and records its accepted length under the
rules' one name: the figure Prometheus records is the one the server's own /metrics gives."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import httpx
import pytest
import yaml

from ddops.monitor import render
from ddops.monitor.targets import target_of
from tests.server_process import ServerProcess, free_port

PROMETHEUS = shutil.which("prometheus")
GOLDEN = Path(__file__).resolve().parents[1] / "ops" / "golden"
KEY = "monitor-test-key"
pytestmark = pytest.mark.skipif(PROMETHEUS is None, reason="no prometheus (apt package prometheus: make apt)")


def test_a_unit_becomes_a_target_labelled_by_what_it_runs():
    unit = (GOLDEN / "cpu-ddtree.service").read_text()
    target = target_of("lab-1", "10.0.0.5", "llm.service", unit, f"DDOPS_API_KEY={KEY}\n", None)
    assert target.address == "10.0.0.5:30000" and target.api_key == KEY
    assert target.labels == {"host": "lab-1", "unit": "llm.service", "profile": "cpu-ddtree", "runtime": "bundled",
                             "method": "ddtree", "speculative": "true", "role": "production"}
    plain = target_of("lab-1", "10.0.0.5", "ar.service", (GOLDEN / "cpu-ar.service").read_text(), None,
                      ("lab-1", "ar.service"))
    assert (plain.labels["method"], plain.labels["speculative"], plain.labels["role"]) == ("none", "false", "shadow")
    assert target_of("lab-1", "10.0.0.5", "x.service", "[Service]\nExecStart=/bin/true\n", None, None) is None


def query(base: str, promql: str) -> list[dict]:
    response = httpx.get(base + "/api/v1/query", params={"query": promql}, timeout=5)
    response.raise_for_status()    # 503 "Service Unavailable" while it starts (seen in CI): wait_for retries
    return response.json()["data"]["result"]


def wait_for(base: str, promql: str, seconds: float = 90) -> list[dict]:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            found = query(base, promql)
        except httpx.HTTPError:       # still starting
            found = []
        if found:
            return found
        time.sleep(1)
    raise AssertionError(f"Prometheus recorded nothing for {promql} in {seconds:.0f} s")


def test_prometheus_scrapes_the_rendered_targets_and_records_the_accepted_length(
        tiny_dirs, distilled_drafts, tmp_path):
    server = ServerProcess(tiny_dirs["llama"], tmp_path / "server.log", "--speculative-algorithm", "DDTREE",
                           "--speculative-draft-model-path", str(distilled_drafts["llama"]),
                           "--speculative-ddtree-budget", "8", "--speculative-adaptive", "off",
                           "--metrics-require-api-key", api_key=KEY).wait_ready()
    prometheus = None
    try:
        unit = (GOLDEN / "cpu-ddtree.service").read_text().replace("--port 30000", f"--port {server.port}")
        target = target_of("lab-1", "127.0.0.1", "llm.service", unit, f"DDOPS_API_KEY={KEY}\n", None)
        out = tmp_path / "monitor"
        [job] = render.write(out, [target], interval="1s")
        assert (out / "keys" / f"{job}.key").stat().st_mode & 0o777 == 0o600
        scrape = yaml.safe_load((out / "scrape.yml").read_text())["scrape_configs"]
        config = {"global": {"evaluation_interval": "1s"}, "scrape_configs": scrape,
                  "rule_files": [str(out / "rules" / "ddops.yml")]}
        (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
        port = free_port()
        prometheus = subprocess.Popen([PROMETHEUS, f"--config.file={tmp_path / 'prometheus.yml'}",
                                       f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                                       f"--web.listen-address=127.0.0.1:{port}"],
                                      stdout=subprocess.DEVNULL, stderr=open(tmp_path / "prometheus.log", "w"))
        base = f"http://127.0.0.1:{port}"
        headers = {"Authorization": f"Bearer {KEY}"}
        up = wait_for(base, f'up{{job="{job}"}} == 1')      # scraped through the key file
        assert up[0]["metric"]["unit"] == "llm.service" and up[0]["metric"]["runtime"] == "bundled"
        # after a first scrape: rates are of what changed between scrapes
        for prompt in ("def fibonacci(n):", "1, 2, 3, 4,", "Once upon a time"):
            body = {"model": "llama", "prompt": prompt, "max_tokens": 48, "temperature": 0}
            assert httpx.post(server.url + "/v1/completions", json=body, headers=headers, timeout=60).status_code == 200
        page = httpx.get(server.url + "/metrics", headers=headers, timeout=5).text
        sums = {line.split()[0]: float(line.split()[1]) for line in page.splitlines()
                if line.startswith("serving_spec_accept_length_")}
        own = sums["serving_spec_accept_length_sum"] / sums["serving_spec_accept_length_count"]
        # a rule evaluated between two requests' scrapes records a part; wait for the whole
        recorded = wait_for(base, f'ddops:accept_length:rate5m{{host="lab-1", speculative="true"}} '
                                  f'> {own - 1e-6} < {own + 1e-6}')
        assert own > 1.3 and float(recorded[0]["value"][1]) == pytest.approx(own, rel=1e-6)
    finally:
        if prometheus is not None:
            prometheus.terminate()
            prometheus.wait(timeout=30)
        server.stop()
