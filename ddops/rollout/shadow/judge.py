"""Pure judgement of a shadow comparison against a profile's rollout policy.

The policy is any object with the rollout fields of a profile (`Profile.rollout`):
min_token_equality (fraction 0..1 of matched positions at temperature 0),
max_p95_latency_regression (fraction: shadow p95 may exceed production's by at most this),
min_tokens_per_s_ratio (shadow tokens/s over production's). A field set to None is not checked.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class Check:
    name: str
    passed: bool
    observed: float | None
    required: str  # the bound as people read it, e.g. ">= 1.00"
    reason: str


@dataclass(frozen=True)
class Verdict:
    passed: bool
    checks: tuple[Check, ...]

    @property
    def reasons(self) -> list[str]:
        return [c.reason for c in self.checks if not c.passed]

    def to_dict(self) -> dict:
        return {"passed": self.passed, "reasons": self.reasons,
                "checks": [asdict(c) for c in self.checks]}


def judge(comparison: Any, policy: Any) -> Verdict:
    """`comparison`: a compare.Comparison (or anything with its summary fields)."""
    checks = [_answered(comparison),
              _equality(comparison.token_equality, getattr(policy, "min_token_equality", None)),
              _latency(comparison, getattr(policy, "max_p95_latency_regression", None)),
              _throughput(comparison, getattr(policy, "min_tokens_per_s_ratio", None))]
    kept = tuple(c for c in checks if c is not None)
    return Verdict(all(c.passed for c in kept), kept)


def _answered(comparison: Any) -> Check:
    errors = comparison.production.errors + comparison.shadow.errors
    return Check("all answered", errors == 0, float(errors), "== 0 errors",
                 f"{comparison.production.errors} production and {comparison.shadow.errors} "
                 f"shadow requests failed" if errors else "every request answered")


def _equality(observed: float, minimum: float | None) -> Check | None:
    if minimum is None:
        return None
    ok = observed >= minimum
    return Check("token equality", ok, observed, f">= {minimum:.2%}",
                 f"token equality {observed:.2%} " + ("meets" if ok else "is below") +
                 f" the required {minimum:.2%}")


def _latency(comparison: Any, max_regression: float | None) -> Check | None:
    if max_regression is None:
        return None
    base, cand = comparison.production.latency_p95_s, comparison.shadow.latency_p95_s
    if not base or cand is None:
        return Check("p95 latency", False, None, f"<= +{max_regression:.0%}",
                     "p95 latency not measured (no successful requests)")
    regression = cand / base - 1.0
    ok = regression <= max_regression
    return Check("p95 latency", ok, regression, f"<= +{max_regression:.0%}",
                 f"shadow p95 {cand * 1000:.0f} ms is {regression:+.0%} vs production "
                 f"{base * 1000:.0f} ms (allowed +{max_regression:.0%})")


def _throughput(comparison: Any, min_ratio: float | None) -> Check | None:
    if min_ratio is None:
        return None
    base, cand = comparison.production.tokens_per_s, comparison.shadow.tokens_per_s
    if not base or cand is None:
        return Check("tokens/s", False, None, f">= {min_ratio:.2f}x",
                     "tokens/s not measured (no successful requests)")
    ratio = cand / base
    ok = ratio >= min_ratio
    return Check("tokens/s", ok, ratio, f">= {min_ratio:.2f}x",
                 f"shadow {cand:.1f} tok/s is {ratio:.2f}x production {base:.1f} tok/s "
                 f"(required {min_ratio:.2f}x)")
