"""A bake's error ratio counts requests the clients abandoned, and says how many (issue 26):
the bundled runtime's 499s on generation paths. vLLM and SGLang cannot tell them (None)."""

from __future__ import annotations

import pytest

from ddops.rollout.fleet.scrape import parse
from serving.server.metrics import Metrics
from tests.rollout.test_analysis import SGLANG, vllm_metrics


def bundled(ok: int, cancelled: int, failed: int = 0) -> str:
    m = Metrics()
    m.requests.labels("/v1/chat/completions", "200").inc(ok)
    m.requests.labels("/v1/chat/completions", "499").inc(cancelled)
    m.requests.labels("/v1/completions", "500").inc(failed)
    m.requests.labels("/health", "499").inc(7)      # not generation traffic
    return m.render().decode()


def test_abandoned_generations_are_errors_and_named_as_cancelled():
    figures = parse(bundled(ok=6, cancelled=3, failed=1)).summary()
    assert figures["requests"] == 10 and figures["errors"] == 4 and figures["cancelled"] == 3
    assert figures["error_ratio"] == pytest.approx(0.4)


def test_a_window_subtracts_cancellations_too():
    window = parse(bundled(ok=10, cancelled=5), at=10).since(parse(bundled(ok=4, cancelled=1), at=0))
    figures = window.summary()
    assert figures["requests"] == 10 and figures["cancelled"] == 4 and figures["error_ratio"] == pytest.approx(0.4)


@pytest.mark.parametrize("page", [SGLANG, vllm_metrics()], ids=["sglang", "vllm"])
def test_sglang_and_vllm_cannot_tell_cancellations_apart(page):
    figures = parse(page).summary()
    assert figures["cancelled"] is None and figures["errors"] > 0
