"""Watch changed hosts while a wave bakes: sample /metrics every `interval_s` through
`bake_s`, judge each sample (ddops.rollout.fleet.bake_checks), stop at the first failure.

Samples fall on fixed marks (interval_s, 2*interval_s, ..., bake_s from the bake's start), so
time spent reading /metrics never shifts later samples: while a sample's reads take less than
interval_s, a bake takes ceil(bake_s / interval_s) samples and ends at bake_s (plus the last
reads); longer reads skip the marks they ran past, and the bake_s mark is always sampled.

Baselines: `before` compares each host with its own figures read just before its change
(everything its previous process served); `unchanged` compares with the hosts not changed
yet, over the same window, and falls back to `before` when none is left (the last wave). With `probe:` the watcher sends chat requests itself, to the
changed hosts and to the unchanged baseline hosts, so a quiet fleet still gets judged.
Every sample and verdict goes to `record(host, kind, data)`, which keeps it in the rollout
state. A window's `error_ratio` counts requests the clients abandoned (499, vLLM's "abort")
as errors, and its `cancelled` figure says how many of the errors they were
(ddops.rollout.fleet.scrape), so a canary whose clients give up fails its error check. Network problems are data: a changed host whose /metrics fails twice in a row fails.
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass
from typing import Callable, Mapping

import httpx

from ddops.profile.analysis import AnalysisSpec, ProbeSpec
from ddops.rollout.fleet import promql, scrape
from ddops.rollout.fleet.bake_checks import FAIL, WAIT, final_verdict, judge

SCRAPE_ERRORS_TO_FAIL = 2


@dataclass(frozen=True)
class Endpoint:
    base_url: str
    model: str  # served model name, for probe requests
    api_key: str | None = None
    unit: str = ""  # the unit serving it: a PromQL query's `$unit`


class Watcher:
    def __init__(self, spec: AnalysisSpec, bake_s: float, endpoints: Mapping[str, Endpoint],
                 record: Callable[[str, str, dict], None], read=scrape.read,
                 sleep: Callable[[float], None] = time.sleep,
                 clock: Callable[[], float] = time.monotonic, ask=None) -> None:
        self.spec, self.bake_s, self.endpoints = spec, bake_s, endpoints
        self.record, self.read, self.sleep, self.clock = record, read, sleep, clock
        self.ask = ask or promql.ask     # a PromQL query -> (value, why none)
        self.before: dict[str, dict | None] = {}

    def capture_before(self, host: str) -> None:
        """The host's figures before its change (its process's whole life so far)."""
        try:
            figures = self._read(host).summary()
        except scrape.ScrapeError as err:
            figures = None
            self.record(host, "baseline", {"source": "before", "error": str(err)})
        else:
            self.record(host, "baseline", {"source": "before", "figures": figures})
        self.before[host] = figures

    def bake(self, hosts: list[str], unchanged: list[str]) -> dict[str, dict]:
        """Verdict per host ({status, passed, reasons}) after baking `hosts`."""
        pool = unchanged if self.spec.baseline == "unchanged" else []
        probes = Probes(self.spec.probe, [self.endpoints[h] for h in hosts + pool])
        start = {h: self._try_read(h) for h in hosts + pool}
        samples: dict[str, list[dict]] = {h: [] for h in hosts}
        errors = {h: 0 for h in hosts}
        began = self.clock()
        with probes:
            while True:
                due = next_mark(self.clock() - began, self.spec.interval_s, self.bake_s)
                self.sleep(max(0.0, due - (self.clock() - began)))
                baseline = self._pooled(pool, start)
                for host in hosts:
                    sample = self._sample(host, start, baseline, errors)
                    samples[host].append(sample)
                    self.record(host, "sample", sample)
                if any(s[-1]["verdict"] == FAIL for s in samples.values()) or due >= self.bake_s:
                    break
        verdicts = {h: final_verdict(self.spec, samples[h]) for h in hosts}
        for host, verdict in verdicts.items():
            self.record(host, "verdict", verdict)
        return verdicts

    def _sample(self, host: str, start: dict, baseline: dict | None, errors: dict) -> dict:
        now = self._try_read(host)
        at = round(time.time(), 3)
        problem = next((s for s in (now, start[host]) if isinstance(s, str)), None)
        if problem is not None:
            errors[host] += 1
            failed = errors[host] >= SCRAPE_ERRORS_TO_FAIL
            return {"time": at, "verdict": FAIL if failed else "wait", "reason": problem, "checks": []}
        errors[host] = 0
        window = now.since(start[host]).summary()
        base = baseline if baseline is not None else self.before.get(host)
        return {"time": at, "window": window, "baseline": base, **self._judge(host, window, base)}

    def _judge(self, host: str, window: dict, base: dict | None) -> dict:
        """The checks on the window, then (once it is judged) the PromQL queries for the host:
        one that fails fails the sample; one unjudged keeps it waiting (never a pass)."""
        verdict = judge(self.spec, window, base)
        if self.spec.prometheus is None or verdict["verdict"] == WAIT:
            return verdict
        asked = promql.checks(self.spec.prometheus, host, self.endpoints[host].unit, self.ask)
        checks = verdict["checks"] + asked
        if any(c["status"] == FAIL for c in checks):
            return {"verdict": FAIL, "checks": checks}
        unjudged = [c["reason"] for c in asked if c["status"] == promql.UNJUDGED]
        if unjudged:
            return {"verdict": WAIT, "checks": checks, "reason": "; ".join(unjudged)}
        return {"verdict": verdict["verdict"], "checks": checks}

    def _pooled(self, pool: list[str], start: dict) -> dict | None:
        """The unchanged hosts' window, summed as one server's (None when none is readable)."""
        total = None
        for host in pool:
            now = self._try_read(host)
            if isinstance(now, str) or isinstance(start[host], str):
                continue
            window = now.since(start[host])
            total = window if total is None else total.plus(window)
        return total.summary() if total is not None else None

    def _read(self, host: str) -> scrape.Scrape:
        endpoint = self.endpoints[host]
        return self.read(endpoint.base_url, endpoint.api_key)

    def _try_read(self, host: str):
        try:
            return self._read(host)
        except scrape.ScrapeError as err:
            return str(err)


def next_mark(elapsed: float, interval_s: float, bake_s: float) -> float:
    """The first sampling mark (a multiple of interval_s, or bake_s itself) after `elapsed`; a
    mark reached up to float rounding counts as passed, so no mark is sampled twice."""
    return min(bake_s, interval_s * (math.floor(elapsed / interval_s + 1e-9) + 1))


class Probes:
    """One thread per endpoint sending chat requests at `rate_per_s` (each waits for its
    answer, so a slow server gets fewer); nothing when the spec has no probe."""

    def __init__(self, spec: ProbeSpec | None, endpoints: list[Endpoint]) -> None:
        self.spec, self.endpoints = spec, endpoints
        self.stop = threading.Event()
        self.threads: list[threading.Thread] = []
        self.sent = 0

    def __enter__(self) -> "Probes":
        if self.spec is not None:
            self.threads = [threading.Thread(target=self._loop, args=(e,), daemon=True)
                            for e in self.endpoints]
            for thread in self.threads:
                thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout=30)

    def _loop(self, endpoint: Endpoint) -> None:
        headers = {"Authorization": f"Bearer {endpoint.api_key}"} if endpoint.api_key else {}
        body = {"model": endpoint.model, "max_tokens": self.spec.max_tokens, "temperature": 0,
                "messages": [{"role": "user", "content": self.spec.prompt}]}
        period = 1.0 / self.spec.rate_per_s
        with httpx.Client(timeout=60, trust_env=False, headers=headers) as client:
            while not self.stop.is_set():
                began = time.monotonic()
                try:
                    client.post(f"{endpoint.base_url}/v1/chat/completions", json=body)
                    self.sent += 1
                except httpx.HTTPError:
                    pass  # the server's own counters say whether it answered
                self.stop.wait(max(0.0, period - (time.monotonic() - began)))
