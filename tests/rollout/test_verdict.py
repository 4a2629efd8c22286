"""Verdicts from comparison figures and a rollout policy: pure, milliseconds."""

from dataclasses import dataclass

from ddops.rollout.shadow.stats import EndpointSummary, Sample, agree, percentile, token_equality
from ddops.rollout.shadow.judge import judge


@dataclass(frozen=True)
class Policy:
    min_token_equality: float | None = 1.0
    max_p95_latency_regression: float | None = 0.2
    min_tokens_per_s_ratio: float | None = 0.9


@dataclass(frozen=True)
class Figures:
    production: EndpointSummary
    shadow: EndpointSummary
    token_equality: float


def summary(name, p95=1.0, tps=100.0, errors=0):
    return EndpointSummary(name, 10, errors, p95 / 2, p95, 0.1, 0.2, 1000, tps, 1.0)


def figures(equality=1.0, p95=1.0, tps=100.0, errors=0):
    return Figures(summary("production"), summary("shadow", p95, tps, errors), equality)


def test_identical_fast_shadow_passes():
    verdict = judge(figures(1.0, p95=0.8, tps=150.0), Policy())
    assert verdict.passed and verdict.reasons == []
    assert [c.name for c in verdict.checks] == ["all answered", "token equality", "p95 latency",
                                               "tokens/s"]


def test_any_token_mismatch_fails_at_full_equality():
    verdict = judge(figures(0.995), Policy())
    assert not verdict.passed
    assert verdict.reasons == ["token equality 99.50% is below the required 100.00%"]


def test_latency_regression_beyond_bound_fails():
    verdict = judge(figures(p95=1.3), Policy())
    assert not verdict.passed
    assert "+30%" in verdict.reasons[0] and "allowed +20%" in verdict.reasons[0]


def test_latency_regression_within_bound_passes():
    assert judge(figures(p95=1.19), Policy()).passed


def test_throughput_ratio_below_minimum_fails():
    verdict = judge(figures(tps=80.0), Policy())
    assert not verdict.passed and "0.80x" in verdict.reasons[0]


def test_unset_bounds_are_not_checked():
    verdict = judge(figures(0.5, p95=9.0, tps=1.0), Policy(None, None, None))
    assert verdict.passed and [c.name for c in verdict.checks] == ["all answered"]


def test_failed_requests_fail_even_without_bounds():
    verdict = judge(figures(errors=2), Policy(None, None, None))
    assert not verdict.passed and "2 shadow requests failed" in verdict.reasons[0]


def test_verdict_serialises_checks():
    doc = judge(figures(0.5), Policy()).to_dict()
    assert doc["passed"] is False and len(doc["checks"]) == 4 and len(doc["reasons"]) == 1


def sample(text, ids=None, error=None):
    return Sample("p", text, ids, len(text), 1.0, 0.1, error)


def test_agreement_counts_common_prefix_in_tokens():
    a = agree(sample("abc", (1, 2, 3, 4)), sample("abd", (1, 2, 9, 4, 5)))
    assert (a.equal, a.matched, a.compared, a.unit) == (False, 2, 5, "token")


def test_agreement_falls_back_to_text_without_ids():
    a = agree(sample("hello world"), sample("hello world"))
    assert (a.equal, a.matched, a.compared, a.unit) == (True, 11, 11, "char")


def test_agreement_with_a_failed_side_is_not_equal():
    a = agree(sample(""), sample("", error="HTTP 500"))
    assert not a.equal and a.matched == 0


def test_token_equality_weights_by_length():
    agreements = [agree(sample("x", (1, 2)), sample("x", (1, 2))),
                  agree(sample("y", (1, 2, 3, 4)), sample("y", (1, 9, 3, 4)))]
    assert token_equality(agreements) == 3 / 6


def test_percentile_interpolates():
    assert percentile([1, 2, 3, 4], 50) == 2.5
    assert percentile([5.0], 95) == 5.0
    assert percentile([], 50) is None
    assert round(percentile(list(range(1, 101)), 95), 2) == 95.05
