"""A rollout's PromQL queries: Prometheus's answer read as one number, judged by the query's
bounds, and a sample that cannot judge a query waits instead of passing (pure; the lab test
beside it runs a real Prometheus: tests/rollout/test_lab_promql.py)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from ddops.profile.analysis import AnalysisSpec, PromQuery, PrometheusSpec
from ddops.rollout.fleet import promql
from ddops.rollout.fleet.bake import Endpoint, Watcher

ONE = {"status": "success", "data": {"resultType": "vector", "result": [{"metric": {}, "value": [1.0, "2048"]}]}}


def test_an_answer_is_one_number_or_says_why_not():
    assert promql.value_of(ONE) == (2048.0, "")
    assert promql.value_of({"status": "success", "data": {"resultType": "scalar", "result": [1.0, "0.5"]}}) == (0.5, "")
    assert promql.value_of({"status": "success", "data": {"resultType": "vector", "result": []}})[1] == \
        "the query returned 0 series (one is judged)"
    two = {"status": "success", "data": {"resultType": "vector", "result": [ONE["data"]["result"][0]] * 2}}
    assert promql.value_of(two)[0] is None
    assert promql.value_of({"status": "error", "errorType": "bad_data", "error": "parse error"}) == \
        (None, "Prometheus: bad_data: parse error")
    nan = {"status": "success", "data": {"resultType": "scalar", "result": [1.0, "NaN"]}}
    assert promql.value_of(nan) == (None, "the query returned NaN")


def test_a_query_is_filled_for_the_host_and_judged_by_its_bounds():
    query = PromQuery(name="kv_pool", query='serving_kv_pool_tokens{host="$host", unit="$unit"}', min=4096)
    assert promql.filled(query, "lab-1", "llm.service") == 'serving_kv_pool_tokens{host="lab-1", unit="llm.service"}'
    assert promql.judged(query, "q", 8192.0, "")["status"] == "pass"
    low = promql.judged(query, "q", 2048.0, "")
    assert (low["status"], low["reason"]) == ("fail", "kv_pool 2048 < min 4096")
    assert promql.judged(query, "q", None, "no series")["status"] == promql.UNJUDGED


def test_an_analysis_judges_checks_or_queries_or_both():
    spec = PrometheusSpec(address="http://127.0.0.1:9090", queries=[PromQuery(name="q", query="up", min=1)])
    assert AnalysisSpec(prometheus=spec).checks == []
    with pytest.raises(ValidationError, match="give checks"):
        AnalysisSpec()
    with pytest.raises(ValidationError, match="give max, min or both"):
        PromQuery(name="q", query="up")


@pytest.mark.parametrize("answer, verdict", [((2048.0, ""), "fail"), ((8192.0, ""), "pass"),
                                             ((None, "no series"), "wait")])
def test_a_sample_fails_passes_or_waits_on_its_query(answer, verdict):
    spec = AnalysisSpec(min_requests=1, prometheus=PrometheusSpec(
        address="http://127.0.0.1:9", queries=[PromQuery(name="kv_pool", query='x{host="$host"}', min=4096)]))
    watcher = Watcher(spec, 1, {"lab-1": Endpoint("http://h", "m", unit="llm.service")}, lambda *a: None,
                      ask=lambda s, text: answer)
    judged = watcher._judge("lab-1", {"requests": 5}, None)
    assert judged["verdict"] == verdict
    assert judged["checks"][-1]["query"] == 'x{host="lab-1"}'
