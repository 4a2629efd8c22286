"""A provoked acceptance collapse reaches the operator: a real bundled runtime speculating with
a draft that loads but does not match its target (a fresh random draft: it accepts ~1.0 tokens
a round), scraped by Debian's Prometheus through `ddops monitor render`'s files and rules, whose
`DdopsAcceptanceNearOne` fires and goes through Debian's Alertmanager to a webhook, within 3
minutes of the first request (the goal in docs/monitoring.md)."""

from __future__ import annotations

import shutil
import subprocess
import threading
import time
from pathlib import Path

import httpx
import pytest
import yaml

from ddops.monitor import render
from ddops.monitor.targets import target_of
from serving.tools.tiny_draft import write_tiny_draft
from tests.monitor.test_prometheus import GOLDEN, KEY, PROMETHEUS
from tests.rollout.webhook_receiver import Receiver
from tests.server_process import ServerProcess, free_port

ALERTMANAGER = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")
pytestmark = pytest.mark.skipif(PROMETHEUS is None or ALERTMANAGER is None,
                                reason="no prometheus / prometheus-alertmanager (apt packages: make apt)")
WITHIN_S = 180


def start(argv: list[str], log: Path) -> subprocess.Popen:
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=open(log, "w"))


def alertmanager(folder: Path, webhook: str) -> tuple[subprocess.Popen, int]:
    """Every alert to one webhook, sent as soon as it arrives (group_wait 1 s)."""
    config = {"route": {"receiver": "ops", "group_by": ["alertname"], "group_wait": "1s",
                        "group_interval": "1s", "repeat_interval": "1h"},
              "receivers": [{"name": "ops", "webhook_configs": [{"url": webhook + "/alerts"}]}]}
    (folder / "alertmanager.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    return start([ALERTMANAGER, f"--config.file={folder / 'alertmanager.yml'}",
                  f"--storage.path={folder / 'am-data'}", f"--web.listen-address=127.0.0.1:{port}",
                  "--cluster.listen-address="], folder / "alertmanager.log"), port


def prometheus(folder: Path, out: Path, alertmanager_port: int) -> subprocess.Popen:
    """Scrapes and rules exactly as rendered; alerts to the Alertmanager above."""
    config = {"global": {"evaluation_interval": "1s"},
              "scrape_configs": yaml.safe_load((out / "scrape.yml").read_text())["scrape_configs"],
              "rule_files": [str(out / "rules" / "ddops.yml")],
              "alerting": {"alertmanagers": [{"static_configs": [{"targets": [f"127.0.0.1:{alertmanager_port}"]}]}]}}
    (folder / "prometheus.yml").write_text(yaml.safe_dump(config))
    return start([PROMETHEUS, f"--config.file={folder / 'prometheus.yml'}", f"--storage.tsdb.path={folder / 'tsdb'}",
                  f"--web.listen-address=127.0.0.1:{free_port()}"], folder / "prometheus.log")


def traffic(url: str, stop: threading.Event) -> None:
    """Steady requests, so the accepted length's 5-minute rate has rounds to average."""
    headers = {"Authorization": f"Bearer {KEY}"}
    prompts = ("def fibonacci(n):", "1, 2, 3, 4,", "Once upon a time")
    n = 0
    while not stop.is_set():
        body = {"model": "llama", "prompt": prompts[n % 3], "max_tokens": 24, "temperature": 0}
        httpx.post(url + "/v1/completions", json=body, headers=headers, timeout=60)
        n += 1
        stop.wait(1.0)


def test_an_acceptance_collapse_reaches_the_alertmanager_webhook_within_three_minutes(tiny_dirs, tmp_path):
    draft = write_tiny_draft(tiny_dirs["llama"], tmp_path / "random-draft", seed=1)
    server = ServerProcess(tiny_dirs["llama"], tmp_path / "server.log", "--speculative-algorithm", "DDTREE",
                           "--speculative-draft-model-path", str(draft), "--speculative-ddtree-budget", "8",
                           "--speculative-adaptive", "off", "--metrics-require-api-key", api_key=KEY).wait_ready()
    unit = (GOLDEN / "cpu-ddtree.service").read_text().replace("--port 30000", f"--port {server.port}")
    out = tmp_path / "monitor"
    render.write(out, [target_of("lab-1", "127.0.0.1", "llm.service", unit, f"DDOPS_API_KEY={KEY}\n", None)],
                 interval="1s")
    stop, procs = threading.Event(), []
    try:
        with Receiver() as receiver:
            am, am_port = alertmanager(tmp_path, receiver.url)
            procs += [am, prometheus(tmp_path, out, am_port)]
            began = time.monotonic()
            threading.Thread(target=traffic, args=(server.url, stop), daemon=True).start()
            fired = None
            while fired is None and time.monotonic() - began < WITHIN_S:
                fired = next((a for _, body in receiver.received for a in body.get("alerts", [])
                              if a["labels"].get("alertname") == "DdopsAcceptanceNearOne"), None)
                time.sleep(1)
            took = time.monotonic() - began
    finally:
        stop.set()
        for proc in procs:
            proc.terminate()
            proc.wait(timeout=30)
        server.stop()
    assert fired is not None, f"no DdopsAcceptanceNearOne at the webhook within {WITHIN_S} s"
    assert fired["status"] == "firing" and took < WITHIN_S
    labels = fired["labels"]
    assert (labels["host"], labels["unit"], labels["method"], labels["speculative"]) == \
        ("lab-1", "llm.service", "ddtree", "true")
    assert "draft no longer matches the target" in fired["annotations"]["summary"]
