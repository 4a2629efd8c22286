"""Pure arithmetic of a shadow comparison: per-prompt agreement and per-endpoint figures.

Speculative decoding is lossless, so at temperature 0 a correct shadow reproduces production's
tokens exactly. Agreement is counted as the common prefix: after the first differing token the
two continuations condition on different text and are no longer comparable position by position.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Sequence


@dataclass(frozen=True)
class Sample:
    """One prompt answered by one endpoint."""

    prompt_id: str
    text: str
    token_ids: tuple[int, ...] | None  # None when the server does not return ids
    completion_tokens: int
    latency_s: float
    ttft_s: float | None  # first streamed content; None when nothing was streamed
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


@dataclass(frozen=True)
class Agreement:
    """Production vs shadow on one prompt."""

    prompt_id: str
    equal: bool
    matched: int  # length of the common prefix
    compared: int  # the longer of the two outputs
    unit: str  # "token" (ids compared) or "char" (text compared)


@dataclass(frozen=True)
class EndpointSummary:
    name: str
    requests: int
    errors: int
    latency_p50_s: float | None
    latency_p95_s: float | None
    ttft_p50_s: float | None
    ttft_p95_s: float | None
    completion_tokens: int
    tokens_per_s: float | None  # completion tokens / wall time of the phase (concurrency included)
    accept_length: float | None  # server-reported mean accepted tokens per verify round

    def to_dict(self) -> dict:
        return asdict(self)


def percentile(values: Sequence[float], q: float) -> float | None:
    """Linear interpolation between closest ranks; q in [0, 100]; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100.0
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def agree(production: Sample, shadow: Sample) -> Agreement:
    """Common-prefix agreement, in token ids when both sides returned them, else in characters."""
    if production.token_ids is not None and shadow.token_ids is not None:
        a, b, unit = production.token_ids, shadow.token_ids, "token"
    else:
        a, b, unit = production.text, shadow.text, "char"
    if not (production.ok and shadow.ok):
        return Agreement(production.prompt_id, False, 0, max(len(a), len(b), 1), unit)
    matched = 0
    for x, y in zip(a, b):
        if x != y:
            break
        matched += 1
    compared = max(len(a), len(b))
    return Agreement(production.prompt_id, a == b, matched, compared, unit)


def token_equality(agreements: Sequence[Agreement]) -> float:
    """Matched over compared positions across all prompts; 1.0 means every output identical."""
    compared = sum(a.compared for a in agreements)
    if compared == 0:
        return 1.0 if all(a.equal for a in agreements) else 0.0
    return sum(a.matched for a in agreements) / compared


def summarize(name: str, samples: Sequence[Sample], wall_s: float,
              accept_length: float | None) -> EndpointSummary:
    done = [s for s in samples if s.ok]
    latencies = [s.latency_s for s in done]
    ttfts = [s.ttft_s for s in done if s.ttft_s is not None]
    tokens = sum(s.completion_tokens for s in done)
    return EndpointSummary(
        name=name, requests=len(samples), errors=len(samples) - len(done),
        latency_p50_s=percentile(latencies, 50), latency_p95_s=percentile(latencies, 95),
        ttft_p50_s=percentile(ttfts, 50), ttft_p95_s=percentile(ttfts, 95),
        completion_tokens=tokens,
        tokens_per_s=tokens / wall_s if wall_s > 0 and done else None,
        accept_length=accept_length)
