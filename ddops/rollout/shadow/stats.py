"""Pure arithmetic of a shadow comparison: per-prompt agreement and per-endpoint figures.

Speculative decoding is lossless, so at temperature 0 a correct shadow reproduces production's
tokens exactly. Agreement is counted as the common prefix: after the first differing token the
two continuations condition on different text and are no longer comparable position by position.

Positions are token ids where both servers return them. Where only one does (vLLM returns ids
with `return_token_ids`, the bundled runtime only text), that side's ids are laid on the common
text: a token counts as matched once all the text it completed lies in the prefix both answers
share. Where neither does, positions are characters.
"""

from __future__ import annotations

import itertools
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
    # token_ends[i]: characters of `text` settled once token i was streamed (the end of the
    # first chunk at or after it that added text); len(text) + 1 for trailing tokens that
    # added none (EOS). None when the server returns no ids.
    token_ends: tuple[int, ...] | None = None
    prompt_tokens: int | None = None  # the server's own count (usage), to tell template drift

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
    ids: str = "both"  # whose token ids count positions: both, production, shadow, none
    first_divergence: int | None = None  # position (in `unit`) of the first difference; None: equal


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
    """Common-prefix agreement: in token ids when both sides returned them, in one side's ids
    laid on the common text when only one did, else in characters."""
    if production.token_ids is not None and shadow.token_ids is not None:
        return _agreement(production, shadow, production.token_ids, shadow.token_ids, "token", "both")
    if production.token_ends is not None and production.token_ids is not None:
        return _aligned(production, shadow, production, "production")
    if shadow.token_ends is not None and shadow.token_ids is not None:
        return _aligned(production, shadow, shadow, "shadow")
    return _agreement(production, shadow, production.text, shadow.text, "char", "none")


def _agreement(production: Sample, shadow: Sample, a: Sequence, b: Sequence, unit: str,
               ids: str) -> Agreement:
    if not (production.ok and shadow.ok):
        return Agreement(production.prompt_id, False, 0, max(len(a), len(b), 1), unit, ids, 0)
    matched = common_prefix(a, b)
    equal = tuple(a) == tuple(b)
    return Agreement(production.prompt_id, equal, matched, max(len(a), len(b)), unit, ids,
                     None if equal else matched)


def _aligned(production: Sample, shadow: Sample, counted: Sample, ids: str) -> Agreement:
    """`counted`'s ids on the text both share; the other side's length is its usage count."""
    other = shadow if counted is production else production
    compared = max(len(counted.token_ids), other.completion_tokens)
    if not (production.ok and shadow.ok):
        return Agreement(production.prompt_id, False, 0, max(compared, 1), "token", ids, 0)
    if production.text == shadow.text:
        return Agreement(production.prompt_id, True, len(counted.token_ids), len(counted.token_ids),
                         "token", ids, None)
    common = common_prefix(production.text, shadow.text)
    matched = sum(1 for _ in itertools.takewhile(lambda end: end <= common, counted.token_ends))
    return Agreement(production.prompt_id, False, matched, compared, "token", ids, matched)


def common_prefix(a: Sequence, b: Sequence) -> int:
    matched = 0
    for x, y in zip(a, b):
        if x != y:
            break
        matched += 1
    return matched


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
