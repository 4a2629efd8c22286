"""One endpoint measured at each concurrency level, and a candidate judged against production.

The load is the shadow replay's (rollout/shadow/compare.py `phase`): greedy, streamed, at most
`concurrency` requests in flight, each level its own phase. Per level: completion tokens a
second over the phase's wall time, TTFT and inter-token latency p50/p99 over its requests (a
request's ITL is its mean gap between tokens after the first: (latency - TTFT) / (tokens - 1)),
errors, and T=0 token equality with production's answers to the same prompts (lossless check).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Sequence

from ddops.rollout.shadow.compare import Endpoint, Settings, phase
from ddops.rollout.shadow.prompts import Prompt
from ddops.rollout.shadow.stats import Sample, agree, percentile, token_equality


@dataclass(frozen=True)
class Level:
    concurrency: int
    requests: int
    errors: int
    tokens_per_s: float | None
    ttft_p50_s: float | None
    ttft_p99_s: float | None
    itl_p50_s: float | None
    itl_p99_s: float | None
    token_equality: float | None = None    # against production's answers; None for production

    def to_dict(self) -> dict:
        return asdict(self)


MIRRORED = 0    # the level of mirrored traffic: its concurrency is the traffic's own


@dataclass(frozen=True)
class Load:
    """What each level replays; or, `mirrored`, production's own requests copied to the
    endpoint until it has answered `count` of them (one level, MIRRORED), within `wait_s`."""
    prompts: tuple[Prompt, ...]
    levels: tuple[int, ...]
    max_tokens: int
    mirrored: bool = False
    count: int = 0
    wait_s: float = 0.0


def level_name(concurrency: int) -> str:
    return "mirrored traffic" if concurrency == MIRRORED else f"concurrency {concurrency}"


def itl_of(sample: Sample) -> float | None:
    if not sample.ok or sample.ttft_s is None or sample.completion_tokens < 2:
        return None
    return (sample.latency_s - sample.ttft_s) / (sample.completion_tokens - 1)


def level_of(concurrency: int, samples: Sequence[Sample], wall_s: float,
             reference: Sequence[Sample] | None = None) -> Level:
    done = [s for s in samples if s.ok]
    ttfts = [s.ttft_s for s in done if s.ttft_s is not None]
    itls = [x for x in map(itl_of, done) if x is not None]
    tokens = sum(s.completion_tokens for s in done)
    equality = token_equality([agree(p, s) for p, s in zip(reference, samples)]) if reference else None
    return Level(concurrency, len(samples), len(samples) - len(done),
                 tokens / wall_s if done and wall_s > 0 else None,
                 percentile(ttfts, 50), percentile(ttfts, 99), percentile(itls, 50), percentile(itls, 99),
                 equality)


def mirrored_level(stats: dict) -> Level:
    """The level an endpoint ran on mirrored traffic, from its sink's GET /mirror/stats: per
    request speed (completion tokens over the requests' own seconds: the arrival rate is the
    traffic's, not the endpoint's), TTFT and ITL percentiles, and token equality with the
    answers production actually sent."""
    shadow, compared = stats["shadow"], stats["compared"]
    return Level(MIRRORED, compared + stats["failed"], stats["failed"], shadow["tokens_per_s"],
                 shadow["ttft_p50_s"], shadow.get("ttft_p99_s"), shadow["itl_p50_s"], shadow.get("itl_p99_s"),
                 stats["deterministic"]["token_equality"] if stats["deterministic"]["requests"] else None)


def run_level(endpoint: Endpoint, load: Load, concurrency: int,
              reference: Sequence[Sample] | None = None) -> tuple[Level, list[Sample], float | None]:
    """One level: its figures, its samples (production's are the next candidates' reference)
    and the endpoint's accepted length as it reports it after the level."""
    settings = Settings(count=len(load.prompts), concurrency=concurrency, max_tokens=load.max_tokens)
    samples, wall_s, accept = phase(endpoint, load.prompts, settings)
    return level_of(concurrency, samples, wall_s, reference), samples, accept


def ratio(candidate: Level, production: Level, objective: str) -> float | None:
    """The candidate's figure as a multiple of production's at the same level, higher better:
    throughput = tok/s over production's; latency = production's ITL p50 over the candidate's."""
    if objective == "throughput":
        a, b = candidate.tokens_per_s, production.tokens_per_s
    else:
        a, b = production.itl_p50_s, candidate.itl_p50_s
    return a / b if a and b else None


def geomean(values: Sequence[float | None]) -> float:
    """0 when any level has no figure (a level that failed fails the candidate)."""
    if not values or any(v is None or v <= 0 for v in values):
        return 0.0
    return math.exp(sum(math.log(v) for v in values) / len(values))


@dataclass(frozen=True)
class Requirements:
    """What a candidate must meet to be chosen: no errors, production's answers (the profile's
    rollout.min_token_equality), and the operator's SLO at every level."""
    min_token_equality: float = 1.0
    ttft_p99_s: float | None = None
    itl_p99_s: float | None = None

    def unmet(self, levels: Sequence[Level]) -> list[str]:
        found = []
        for lv in levels:
            at = f"on {level_name(lv.concurrency)}" if lv.concurrency == MIRRORED else f"at concurrency {lv.concurrency}"
            if lv.errors:
                found.append(f"{lv.errors} of {lv.requests} requests failed {at}")
            if lv.token_equality is not None and lv.token_equality < self.min_token_equality:
                found.append(f"token equality with production {lv.token_equality:.3f} < "
                             f"{self.min_token_equality} {at}")
            for name, bound, value in (("TTFT p99", self.ttft_p99_s, lv.ttft_p99_s),
                                       ("ITL p99", self.itl_p99_s, lv.itl_p99_s)):
                if bound is not None and (value is None or value > bound):
                    shown = "none" if value is None else f"{value * 1000:.0f} ms"
                    found.append(f"{name} {shown} > SLO {bound * 1000:.0f} ms {at}")
        return found


def parse_slo(text: str | None) -> dict[str, float]:
    """`ttft_p99_ms=800,itl_p99_ms=60` -> {"ttft_p99_s": 0.8, "itl_p99_s": 0.06}."""
    from ddops.exits import BadInput
    if not text:
        return {}
    out = {}
    for part in text.split(","):
        name, _, value = part.partition("=")
        name = name.strip()
        if name not in ("ttft_p99_ms", "itl_p99_ms"):
            raise BadInput(f"--slo: unknown bound {name!r}; the bounds are ttft_p99_ms and itl_p99_ms")
        try:
            ms = float(value)
        except ValueError:
            raise BadInput(f"--slo: {name} must be a number of milliseconds, got {value!r}") from None
        if ms <= 0:
            raise BadInput(f"--slo: {name} must be positive, got {value}")
        out[name.replace("_ms", "_s")] = ms / 1000
    return out
