"""Prometheus targets for every service ddops deployed: file-based service discovery.

Read from the hosts, on demand (`ddops monitor render`): what runs where lives in each host's
deploy history and unit files, which deploy, switch, shadow and rollout already keep current,
so a render is true as of its run and nothing here can go stale between runs. Rerun it after
a change (a timer or the operator's CI can); Prometheus rereads the files by itself.

Each unit becomes one target `ADDRESS:PORT` with the labels rules.TARGET_LABELS (`method` the
METHODS key, `none` for plain decoding, and `speculative` its capability, `true` or `false`;
`role` is `shadow` for the unit `ddops shadow start` recorded, `production` otherwise). Units are grouped by API key: one
scrape job per key, which reads it from a 0600 file beside the targets (Prometheus takes one
credentials file per job).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from ddops.deploy.desired import api_key_of, env_file_of, unit_argv
from ddops.deploy.gate import endpoint
from ddops.profile.launch import read_launch
from ddops.profile.methods import METHODS
from ddops.render import read_header

UNKNOWN = "unknown"           # the profile label of a unit without a ddops header
METRICS_PATH = "/metrics"    # the path every runtime in ddops/profile/runtimes.py serves them on


@dataclass(frozen=True)
class Target:
    address: str                 # host:port as Prometheus dials it
    labels: dict[str, str]       # rules.TARGET_LABELS
    api_key: str | None


def target_of(host: str, host_address: str, unit: str, unit_text: str, env_text: str | None,
              shadow: tuple[str, str] | None) -> Target | None:
    """A unit's target from its files; None for a unit that is no runtime ddops knows."""
    argv = unit_argv(unit_text)
    launch = read_launch(argv) if argv else None
    if launch is None or launch.runtime is None:
        return None
    url = endpoint(argv, host_address)
    method = launch.method or "none"
    labels = {"host": host, "unit": unit, "profile": read_header(unit_text).get("profile") or UNKNOWN,
              "runtime": launch.runtime, "method": method,
              "speculative": str(METHODS[method].is_speculative).lower(),
              "role": "shadow" if shadow == (host, unit) else "production"}
    return Target(url.split("://", 1)[1], labels, api_key_of(env_text))


def job_name(api_key: str | None) -> str:
    """One job per key, named without revealing it."""
    return "ddops" if not api_key else "ddops-" + hashlib.sha256(api_key.encode()).hexdigest()[:8]


def groups(targets: list[Target]) -> dict[str, list[dict]]:
    """job name -> its file_sd document: [{"targets": [...], "labels": {...}}, ...]."""
    jobs: dict[str, list[dict]] = {}
    for t in sorted(targets, key=lambda t: (t.labels["host"], t.labels["unit"])):
        jobs.setdefault(job_name(t.api_key), []).append({"targets": [t.address], "labels": t.labels})
    return jobs


def read_host(remote, shadow: tuple[str, str] | None) -> list[Target]:
    """Every ddops unit on one host (ops.units_on), read over its connection."""
    from ddops.deploy.ops import units_on
    found = []
    for unit in units_on(remote):
        unit_text = remote.read_text(f"/etc/systemd/system/{unit}")
        if not unit_text:
            continue              # removed since (a shadow aborted): its history stays, it does not run
        env_path = env_file_of(unit_text)
        env_text = remote.read_text(env_path) if env_path else None
        target = target_of(remote.host.name, remote.host.address, unit, unit_text, env_text, shadow)
        if target is not None:
            found.append(target)
    return found
