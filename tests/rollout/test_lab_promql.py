"""A rollout judged in PromQL, on real lab hosts: Debian's Prometheus scrapes them through the
files `ddops monitor render` writes, and a canary whose query fails (its KV pool is a quarter
of production's: a capacity regression the gate cannot see) halts the rollout and is reverted,
as a failing direct-scrape check would."""

from __future__ import annotations

import json
import shutil
import subprocess
import time

import httpx
import pytest
import yaml

from ddops.render import read_header
from tests.rollout.test_lab_rollout import lab, write  # noqa: F401 (the module's lab fixture)
from tests.server_process import free_port

PROMETHEUS = shutil.which("prometheus")
pytestmark = [pytest.mark.lab, pytest.mark.skipif(PROMETHEUS is None, reason="no prometheus (make apt)")]
POOL = 'serving_kv_pool_tokens{host="$host"}'


def wait_for(base: str, promql: str, seconds: float = 90) -> float:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            found = httpx.get(base + "/api/v1/query", params={"query": promql}, timeout=5).json()["data"]["result"]
        except (httpx.HTTPError, KeyError, ValueError):
            found = []
        if found:
            return float(found[0]["value"][1])
        time.sleep(1)
    raise AssertionError(f"Prometheus has nothing for {promql} after {seconds:.0f} s")


def test_a_canary_failing_its_promql_query_halts_the_rollout_and_is_reverted(lab, tmp_path):
    hosts = ["lab-1", "lab-2"]
    base = tmp_path / "base.yaml"
    base.write_text(yaml.safe_dump({"profile": "cpu-ar", "hosts": hosts, "wave_size": 2}))
    assert lab.ddops("rollout", str(base), "--yes", "--json").returncode == 0
    out = tmp_path / "monitor"
    rendered = lab.ddops("monitor", "render", "--out", str(out), "--interval", "1s", "--json")
    assert rendered.returncode == 0, rendered.stdout + rendered.stderr
    scrape = yaml.safe_load((out / "scrape.yml").read_text())["scrape_configs"]     # as rendered, no edits
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump({"scrape_configs": scrape}))
    port = free_port()
    prometheus = subprocess.Popen([PROMETHEUS, f"--config.file={tmp_path / 'prometheus.yml'}",
                                   f"--storage.tsdb.path={tmp_path / 'tsdb'}", f"--web.listen-address=127.0.0.1:{port}"],
                                  stdout=subprocess.DEVNULL, stderr=open(tmp_path / "prometheus.log", "w"))
    address = f"http://127.0.0.1:{port}"
    try:
        production = wait_for(address, POOL.replace("$host", "lab-1"))
        assert production == 4 * 1024          # cpu-ar: 4 running requests x 1024 context
        write(lab.root / "profiles", "ro-small", """\
            extends: cpu-ar
            memory: {context_length: 256}
            """)
        plan = tmp_path / "small.yaml"
        plan.write_text(yaml.safe_dump({
            "profile": lab.profile("ro-small"), "hosts": hosts, "canary": 1, "wave_size": 1, "bake_s": 20,
            "analysis": {"interval_s": 2.0, "min_requests": 1, "probe": {"rate_per_s": 2.0},
                         "prometheus": {"address": address,
                                        "queries": [{"name": "kv_pool", "query": POOL, "min": production}]}}}))
        doc = lab.json("rollout", str(plan), "--yes", expect=1)
    finally:
        prometheus.terminate()
        prometheus.wait(timeout=30)
    assert doc["status"] == "halted" and doc["waves"] == [["lab-1"], ["lab-2"]]
    assert {h: s["status"] for h, s in doc["hosts"].items()} == {"lab-1": "failed", "lab-2": "pending"}
    failing = [c for s in doc["analysis"]["lab-1"]["samples"] for c in s.get("checks", []) if c["status"] == "fail"]
    assert failing and failing[-1]["metric"] == "promql:kv_pool" and failing[-1]["value"] == 1024
    assert failing[-1]["query"] == 'serving_kv_pool_tokens{host="lab-1"}'
    for host in hosts:     # the canary back on what it ran, the other never touched
        assert read_header(lab.unit(host))["profile"] == "cpu-ar"
    assert json.loads(json.dumps(doc["hosts"]["lab-1"]))["detail"].startswith("analysis failed")
