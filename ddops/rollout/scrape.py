"""Read a server's /metrics: Prometheus text parsed by prometheus_client, mapped through one
table (`SERIES`) from the bundled runtime's and SGLang's names to what analysis judges.

A `Scrape` holds cumulative counters and histograms as the server reported them; `since`
subtracts an earlier scrape, so every figure describes one window (a restart, which resets
counters, makes the earlier scrape count as zero). `summary` turns a window into figures.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import httpx
from prometheus_client.parser import text_string_to_metric_families

GENERATION_PATHS = ("/v1/chat/completions", "/v1/completions")
# quantity -> family name per runtime (the parser gives counters without `_total`).
SERIES = {
    "requests": {"bundled": "serving_requests", "sglang": "sglang:num_requests"},
    "errors": {"bundled": "serving_requests", "sglang": "sglang:num_aborted_requests"},
    "generated": {"bundled": "serving_generation_tokens", "sglang": "sglang:generation_tokens"},
    "ttft": {"bundled": "serving_time_to_first_token_seconds",
             "sglang": "sglang:time_to_first_token_seconds"},
    "itl": {"bundled": "serving_time_per_output_token_seconds",
            "sglang": "sglang:inter_token_latency_seconds"},
    "e2e": {"bundled": "serving_e2e_request_latency_seconds",
            "sglang": "sglang:e2e_request_latency_seconds"},
    "accept": {"bundled": "serving_spec_accept_length", "sglang": "sglang:spec_accept_length"},
}
QUANTILES = {"p50": 0.5, "p90": 0.9, "p95": 0.95, "p99": 0.99}
FIGURES = ("requests", "errors", "error_ratio", "tokens_per_s", "accept_length",
           *(f"{h}_{q}" for h in ("ttft", "itl", "e2e") for q in QUANTILES))


class ScrapeError(RuntimeError):
    """/metrics could not be read or says nothing this table knows."""


@dataclass(frozen=True)
class Histogram:
    bounds: tuple[float, ...] = ()  # upper bounds, ascending, +Inf last
    cumulative: tuple[float, ...] = ()  # observations <= each bound
    total: float = 0.0  # sum of observations

    @property
    def count(self) -> float:
        return self.cumulative[-1] if self.cumulative else 0.0

    def minus(self, earlier: "Histogram") -> "Histogram":
        if earlier.bounds != self.bounds or earlier.count > self.count:
            return self  # another process (restart) or other buckets: no common window
        return Histogram(self.bounds, tuple(a - b for a, b in zip(self.cumulative, earlier.cumulative)),
                         self.total - earlier.total)

    def quantile(self, q: float) -> float | None:
        """Linear interpolation inside the bucket holding rank q*count (as PromQL's
        histogram_quantile); a rank in the +Inf bucket gives the largest finite bound."""
        if self.count <= 0:
            return None
        rank, lower, below = q * self.count, 0.0, 0.0
        for bound, seen in zip(self.bounds, self.cumulative):
            if seen >= rank:
                if math.isinf(bound):
                    return lower
                inside = seen - below
                return lower + (bound - lower) * ((rank - below) / inside if inside else 1.0)
            lower, below = bound, seen
        return lower


@dataclass(frozen=True)
class Scrape:
    runtime: str  # bundled | sglang
    at: float  # epoch seconds when read
    requests: float = 0.0
    errors: float = 0.0
    generated: float = 0.0
    hist: dict = field(default_factory=dict)  # ttft, itl, e2e, accept (bundled) -> Histogram
    accept_gauge: float | None = None  # SGLang reports accepted length only as a gauge

    def since(self, earlier: "Scrape") -> "Scrape":
        restarted = self.requests < earlier.requests
        base = Scrape(self.runtime, earlier.at) if restarted else earlier
        return Scrape(self.runtime, base.at, self.requests - base.requests, self.errors - base.errors,
                      self.generated - base.generated,
                      {k: h.minus(base.hist.get(k, Histogram())) for k, h in self.hist.items()},
                      self.accept_gauge)

    def summary(self) -> dict:
        """Figures of this window; None where the window has no observation to say it."""
        out = {"requests": self.requests, "errors": self.errors,
               "error_ratio": self.errors / self.requests if self.requests else None}
        e2e = self.hist.get("e2e", Histogram())
        out["tokens_per_s"] = self.generated / e2e.total if e2e.total > 0 else None
        accept = self.hist.get("accept")
        out["accept_length"] = (accept.total / accept.count if accept and accept.count else
                                self.accept_gauge)
        for name in ("ttft", "itl", "e2e"):
            for label, q in QUANTILES.items():
                value = self.hist.get(name, Histogram()).quantile(q)
                out[f"{name}_{label}"] = None if value is None else round(value, 6)
        return {k: (round(v, 6) if isinstance(v, float) else v) for k, v in out.items()}


def parse(text: str, at: float | None = None) -> Scrape:
    families = {f.name: f for f in text_string_to_metric_families(text)}
    runtime = "sglang" if any(name.startswith("sglang:") for name in families) else "bundled"
    if SERIES["requests"][runtime] not in families:
        raise ScrapeError(f"no {SERIES['requests'][runtime]} series: not a bundled or SGLang server's /metrics")
    name = lambda q: SERIES[q][runtime]  # noqa: E731
    requests, errors = _requests(families, runtime)
    hist = {q: _histogram(families.get(name(q))) for q in ("ttft", "itl", "e2e")}
    gauge = None
    if runtime == "bundled":
        hist["accept"] = _histogram(families.get(name("accept")))
    else:
        gauge = _total(families.get(name("accept")), "") or None
    return Scrape(runtime, time.time() if at is None else at, requests, errors,
                  _total(families.get(name("generated")), "_total"), hist, gauge)


def _requests(families: dict, runtime: str) -> tuple[float, float]:
    if runtime == "sglang":
        return (_total(families.get(SERIES["requests"]["sglang"]), "_total"),
                _total(families.get(SERIES["errors"]["sglang"]), "_total"))
    requests = errors = 0.0
    for sample in families[SERIES["requests"]["bundled"]].samples:
        if sample.name.endswith("_total") and sample.labels.get("path") in GENERATION_PATHS:
            requests += sample.value
            errors += sample.value if sample.labels.get("status", "").startswith("5") else 0.0
    return requests, errors


def _total(family, suffix: str) -> float:
    if family is None:
        return 0.0
    return sum(s.value for s in family.samples if s.name == family.name + suffix)


def _histogram(family) -> Histogram:
    """One histogram summed over its label sets (SGLang labels by model, tp rank, ...)."""
    if family is None:
        return Histogram()
    buckets: dict[float, float] = {}
    total = 0.0
    for s in family.samples:
        if s.name.endswith("_bucket"):
            bound = float(s.labels["le"])
            buckets[bound] = buckets.get(bound, 0.0) + s.value
        elif s.name.endswith("_sum"):
            total += s.value
    bounds = tuple(sorted(buckets))
    return Histogram(bounds, tuple(buckets[b] for b in bounds), total)


def read(base_url: str, api_key: str | None = None, timeout_s: float = 10.0) -> Scrape:
    """The key goes along because a server may guard /metrics (`--metrics-require-api-key`)."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        response = httpx.get(f"{base_url}/metrics", headers=headers, timeout=timeout_s, trust_env=False)
    except httpx.HTTPError as exc:
        raise ScrapeError(f"{base_url}/metrics: {type(exc).__name__}: {exc}") from None
    if response.status_code != 200:
        raise ScrapeError(f"{base_url}/metrics: HTTP {response.status_code}")
    return parse(response.text)
