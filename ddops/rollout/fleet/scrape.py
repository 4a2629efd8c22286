"""Read a server's /metrics: Prometheus text parsed by prometheus_client, mapped through one
table (`SERIES`, a `Series` per runtime: the bundled runtime's, SGLang's and vLLM's names) to
what analysis judges. The runtime is the one whose request counter the page holds.

A `Scrape` holds cumulative counters and histograms as the server reported them; `since`
subtracts an earlier scrape, so every figure describes one window (a restart, which resets
counters, makes the earlier scrape count as zero). `summary` turns a window into figures.

`errors` (and so `error_ratio`) counts cancelled requests too, generations the client
abandoned: a canary whose clients give up is not healthy. `cancelled` says how many of the
errors those were where the runtime can tell (docs/contracts.md "What each runtime's metrics
can tell"): the bundled runtime's status 499. vLLM 0.32 never counts a request its client
abandoned (its output processor drops the request before the engine reports it finished) and
SGLang's abort counter mixes client disconnects with API aborts: for both, None.
"""

from __future__ import annotations

import math
import re
import time
from dataclasses import dataclass, field

import httpx
from prometheus_client.parser import text_string_to_metric_families

from ddops import spec_metrics

GENERATION_PATHS = ("/v1/chat/completions", "/v1/completions")
# vLLM's finish reasons (vllm/v1/engine/__init__.py FinishReason): "abort" (aborted by the
# engine: a client's own abort never reaches this counter, see the docstring) and "error"
# (always answered 500) are failed requests; stop, length and repetition are answers.
VLLM_FAILED = ("abort", "error")
CANCELLED_STATUS = "499"        # the bundled runtime: the client left before the answer ended


@dataclass(frozen=True)
class Count:
    """The `_total` samples of a counter family (parser names drop `_total`) whose labels match
    every (label, regular expression) of `match`, matched whole as PromQL's `=~` does; the same
    matchers are written into the operator's recording rules (ddops/monitor/rules.py), so a
    bake and a Prometheus count the same samples."""

    family: str
    match: tuple[tuple[str, str], ...] = ()

    def accepts(self, labels: dict) -> bool:
        return all(re.fullmatch(pattern, labels.get(label, "")) for label, pattern in self.match)

    def selector(self, extra: str = "") -> str:
        """The PromQL selector of these samples, `extra` matchers added: family_total{...}."""
        quoted = ((label, pattern.replace("\\", "\\\\")) for label, pattern in self.match)   # a PromQL string
        matchers = [f'{label}=~"{pattern}"' for label, pattern in quoted] + ([extra] if extra else [])
        return f"{self.family}_total{{{', '.join(matchers)}}}"


def _either(*values: str) -> str:
    return "|".join(re.escape(v) for v in values)


# the bundled runtime's generation requests, and of them the failed ones (5xx, and 499: the client left)
GENERATION = ("path", _either(*GENERATION_PATHS))
FAILED = ("status", f"5..|{CANCELLED_STATUS}")


@dataclass(frozen=True)
class Series:
    """One runtime's names for what analysis judges. Accepted length comes from whichever
    source the runtime has: a histogram of tokens per round, a gauge, or draft counters."""

    requests: Count
    errors: Count   # cancelled requests included
    generated: str  # counter of completion tokens
    ttft: str  # histograms, seconds
    itl: str
    e2e: str
    accept_histogram: str | None = None
    accept_gauge: str | None = None
    spec_drafts: str | None = None  # counters: accepted length = 1 + accepted / drafts
    spec_accepted: str | None = None
    cancelled: Count | None = None  # the part of `errors` the client abandoned; None: not told apart
    mirror_compared: str | None = None  # counters of a mirroring shadow: T=0 requests compared with
    mirror_equal: str | None = None     # production's answer, and those equal (None: cannot mirror)


SERIES = {
    "bundled": Series(requests=Count("serving_requests", (GENERATION,)),
                      errors=Count("serving_requests", (GENERATION, FAILED)),
                      cancelled=Count("serving_requests", (GENERATION, ("status", CANCELLED_STATUS))),
                      generated="serving_generation_tokens",
                      ttft="serving_time_to_first_token_seconds",
                      itl="serving_time_per_output_token_seconds",
                      e2e="serving_e2e_request_latency_seconds",
                      accept_histogram="serving_spec_accept_length",
                      mirror_compared="serving_mirror_deterministic", mirror_equal="serving_mirror_equal"),
    "sglang": Series(requests=Count("sglang:num_requests"), errors=Count("sglang:num_aborted_requests"),
                     generated="sglang:generation_tokens", ttft="sglang:time_to_first_token_seconds",
                     itl="sglang:inter_token_latency_seconds", e2e="sglang:e2e_request_latency_seconds",
                     accept_gauge="sglang:spec_accept_length"),
    # vLLM 0.32 (vllm/v1/metrics/loggers.py): every finished request once, by finish reason.
    "vllm": Series(requests=Count("vllm:request_success"),
                   errors=Count("vllm:request_success", (("finished_reason", _either(*VLLM_FAILED)),)),
                   generated="vllm:generation_tokens", ttft="vllm:time_to_first_token_seconds",
                   itl="vllm:inter_token_latency_seconds", e2e="vllm:e2e_request_latency_seconds",
                   spec_drafts=spec_metrics.DRAFTS, spec_accepted=spec_metrics.ACCEPTED),
}
QUANTILES = {"p50": 0.5, "p90": 0.9, "p95": 0.95, "p99": 0.99}
FIGURES = ("requests", "errors", "cancelled", "error_ratio", "tokens_per_s", "accept_length",
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

    def plus(self, other: "Histogram") -> "Histogram":
        """Observations of both; buckets must agree (else `self` alone: no common histogram)."""
        if not other.bounds:
            return self
        if not self.bounds:
            return other
        if other.bounds != self.bounds:
            return self
        return Histogram(self.bounds, tuple(a + b for a, b in zip(self.cumulative, other.cumulative)),
                         self.total + other.total)

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
    runtime: str  # a key of SERIES
    at: float  # epoch seconds when read
    requests: float = 0.0
    errors: float = 0.0
    generated: float = 0.0
    hist: dict = field(default_factory=dict)  # ttft, itl, e2e, accept (histogram) -> Histogram
    accept_gauge: float | None = None  # SGLang reports accepted length only as a gauge
    drafts: float = 0.0  # vLLM's spec-decode counters
    accepted: float = 0.0
    cancelled: float | None = None  # of `errors`; None where the runtime does not tell

    def since(self, earlier: "Scrape") -> "Scrape":
        restarted = self.requests < earlier.requests
        base = Scrape(self.runtime, earlier.at) if restarted else earlier
        return Scrape(self.runtime, base.at, self.requests - base.requests, self.errors - base.errors,
                      self.generated - base.generated,
                      {k: h.minus(base.hist.get(k, Histogram())) for k, h in self.hist.items()},
                      self.accept_gauge, self.drafts - base.drafts, self.accepted - base.accepted,
                      _minus(self.cancelled, base.cancelled))

    def plus(self, other: "Scrape") -> "Scrape":
        """Two windows as one server's (a pooled baseline)."""
        hist = {k: self.hist.get(k, Histogram()).plus(other.hist.get(k, Histogram()))
                for k in set(self.hist) | set(other.hist)}
        return Scrape(self.runtime, min(self.at, other.at), self.requests + other.requests,
                      self.errors + other.errors, self.generated + other.generated, hist,
                      self.accept_gauge, self.drafts + other.drafts, self.accepted + other.accepted,
                      None if None in (self.cancelled, other.cancelled) else self.cancelled + other.cancelled)

    def accept_length(self) -> float | None:
        accept = self.hist.get("accept")
        if accept and accept.count:
            return accept.total / accept.count
        if self.drafts > 0:
            return 1.0 + self.accepted / self.drafts
        return self.accept_gauge

    def summary(self) -> dict:
        """Figures of this window; None where the window has no observation to say it."""
        out = {"requests": self.requests, "errors": self.errors, "cancelled": self.cancelled,
               "error_ratio": self.errors / self.requests if self.requests else None}
        e2e = self.hist.get("e2e", Histogram())
        out["tokens_per_s"] = self.generated / e2e.total if e2e.total > 0 else None
        out["accept_length"] = self.accept_length()
        for name in ("ttft", "itl", "e2e"):
            for label, q in QUANTILES.items():
                value = self.hist.get(name, Histogram()).quantile(q)
                out[f"{name}_{label}"] = None if value is None else round(value, 6)
        return {k: (round(v, 6) if isinstance(v, float) else v) for k, v in out.items()}


def parse(text: str, at: float | None = None) -> Scrape:
    families = {f.name: f for f in text_string_to_metric_families(text)}
    runtime = next((name for name, series in SERIES.items() if series.requests.family in families), None)
    if runtime is None:
        known = ", ".join(f"{s.requests.family}_total ({name})" for name, s in SERIES.items())
        raise ScrapeError(f"no request counter this table knows: none of {known}")
    series = SERIES[runtime]
    hist = {q: _histogram(families.get(getattr(series, q))) for q in ("ttft", "itl", "e2e")}
    if series.accept_histogram:
        hist["accept"] = _histogram(families.get(series.accept_histogram))
    gauge = (_total(families.get(series.accept_gauge), "") or None) if series.accept_gauge else None
    return Scrape(runtime, time.time() if at is None else at, _count(families, series.requests),
                  _count(families, series.errors), _total(families.get(series.generated), "_total"),
                  hist, gauge, _total(families.get(series.spec_drafts), "_total"),
                  _total(families.get(series.spec_accepted), "_total"),
                  _count(families, series.cancelled) if series.cancelled else None)


def _minus(now: float | None, before: float | None) -> float | None:
    return None if now is None else now - (before or 0.0)


def _count(families: dict, count: Count) -> float:
    family = families.get(count.family)
    if family is None:
        return 0.0
    return sum(s.value for s in family.samples if s.name == family.name + "_total"
               and count.accepts(s.labels))


def _total(family, suffix: str) -> float:
    if family is None:
        return 0.0
    return sum(s.value for s in family.samples if s.name == family.name + suffix)


def _histogram(family) -> Histogram:
    """One histogram summed over its label sets (SGLang and vLLM label by model, engine, ...)."""
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
