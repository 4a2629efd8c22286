"""`ddops monitor render --out DIR`: everything an operator's Prometheus needs, in one folder.

    DIR/targets/JOB.json     file-based service discovery, one file per scrape job (targets.py)
    DIR/keys/JOB.key         that job's API key, mode 0600 (Prometheus' credentials_file)
    DIR/scrape.yml           `scrape_configs` entries to paste into prometheus.yml, naming the above
    DIR/rules/ddops.yml      recording and alert rules (rules.py), with each deployed profile's own
                             bounds (its `monitoring:` section)
    DIR/dashboard.json       a Grafana dashboard of the ddops:* series, import-ready

Paths written into scrape.yml are DIR's absolute path, so DIR is where Prometheus reads them.
A rerun replaces the targets and keys of jobs that are gone.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import yaml

from ddops.monitor import rules
from ddops.monitor.targets import METRICS_PATH, Target, groups, job_name

INTERVAL = "15s"
PANELS = (("Accepted length (tokens a round)", "ddops:accept_length:rate5m"),
          ("Tokens per second", "ddops:tokens_per_second:rate5m"),
          ("Time to first token p50 / p99 (s)", "ddops:ttft_seconds:p50", "ddops:ttft_seconds:p99"),
          ("Time per output token p50 / p99 (s)", "ddops:itl_seconds:p50", "ddops:itl_seconds:p99"),
          ("Error ratio", "ddops:error_ratio:rate5m"),
          ("Requests per second", "ddops:requests:rate5m"),
          ("Mirrored T=0 answers equal to production's (shadows)", f"ddops:mirror_equality:ratio{rules.MIRROR_WINDOW}"))


def scrape_configs(out: Path, jobs: dict[str, list[dict]], keyed: set[str], interval: str = INTERVAL) -> list[dict]:
    configs = []
    for job in sorted(jobs):
        config = {"job_name": job, "metrics_path": METRICS_PATH, "scrape_interval": interval,
                  "file_sd_configs": [{"files": [str(out / "targets" / f"{job}.json")]}]}
        if job in keyed:
            config["authorization"] = {"type": "Bearer", "credentials_file": str(out / "keys" / f"{job}.key")}
        configs.append(config)
    return configs


def dashboard() -> dict:
    """Grafana's dashboard model: one time series panel per figure, two a row, over a
    `datasource` variable (the operator's Prometheus)."""
    source = {"type": "prometheus", "uid": "${datasource}"}
    panels = []
    for i, (title, *series) in enumerate(PANELS):
        targets = [{"expr": expr, "refId": chr(65 + n), "legendFormat": "{{host}} {{unit}} ({{role}})"}
                   for n, expr in enumerate(series)]
        panels.append({"id": i + 1, "type": "timeseries", "title": title, "datasource": source,
                       "gridPos": {"h": 8, "w": 12, "x": 12 * (i % 2), "y": 8 * (i // 2)}, "targets": targets})
    return {"title": "ddops: speculative decoding", "uid": "ddops-speculative", "schemaVersion": 39,
            "editable": True, "time": {"from": "now-6h", "to": "now"}, "panels": panels,
            "templating": {"list": [{"name": "datasource", "type": "datasource", "query": "prometheus"}]}}


def write(out: Path, targets: list[Target], interval: str = INTERVAL, profiles: dict | None = None
          ) -> dict[str, list[dict]]:
    """Every file under `out` (made if missing); returns the jobs written. `profiles`: name ->
    schema.MonitoringSpec of the deployed profiles that set their own alert bounds."""
    out = out.resolve()
    jobs = groups(targets)
    keys = {job_name(t.api_key): t.api_key for t in targets if t.api_key}
    for folder in ("targets", "keys", "rules"):
        (out / folder).mkdir(parents=True, exist_ok=True)
    _replace_folder(out / "targets", {f"{job}.json": json.dumps(doc, indent=2) + "\n" for job, doc in jobs.items()})
    _replace_folder(out / "keys", {f"{job}.key": key for job, key in keys.items()}, mode=0o600)
    _atomic(out / "scrape.yml", yaml.safe_dump({"scrape_configs": scrape_configs(out, jobs, set(keys), interval)},
                                                 sort_keys=False))
    _atomic(out / "rules" / "ddops.yml", yaml.safe_dump(rules.rule_file(profiles), sort_keys=False, width=120))
    _atomic(out / "dashboard.json", json.dumps(dashboard(), indent=2) + "\n")
    return jobs


def _replace_folder(folder: Path, files: dict[str, str], mode: int = 0o644) -> None:
    for name, text in files.items():
        _atomic(folder / name, text, mode)
    for stale in folder.iterdir():
        if stale.name not in files and not stale.name.startswith("."):
            stale.unlink()


def _atomic(path: Path, text: str, mode: int = 0o644) -> None:
    """Written whole or not at all (Prometheus rereads target files as they change)."""
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chmod(tmp, mode)
    os.replace(tmp, path)
