"""A rollout's PromQL queries (analysis.prometheus): asked of the operator's Prometheus for one
changed host, and judged like the direct-scrape checks (docs/monitoring.md, "Rollout analysis
in PromQL").

A query is an instant query with `$host` and `$unit` filled in. It must come back as one
number: a scalar, or a vector of exactly one series. No series, several, or Prometheus not
answering is *unjudged*, never a pass: the sample waits, and a bake that never judged a query
ends as one without traffic (`on_no_traffic`, halt by default).
"""

from __future__ import annotations

import math

import httpx

from ddops.profile.analysis import PromQuery, PrometheusSpec
from ddops.rollout.fleet.bake_checks import FAIL, PASS

UNJUDGED = "unjudged"


def filled(query: PromQuery, host: str, unit: str) -> str:
    return query.query.replace("$host", host).replace("$unit", unit)


def value_of(body: dict) -> tuple[float | None, str]:
    """Pure: the one number a /api/v1/query answer holds, or None and why there is none."""
    if body.get("status") != "success":
        return None, f"Prometheus: {body.get('errorType', 'error')}: {body.get('error', 'no data')}"
    data = body.get("data") or {}
    result = data.get("result")
    if data.get("resultType") == "scalar" and isinstance(result, list) and len(result) == 2:
        number = float(result[1])
    elif data.get("resultType") == "vector" and isinstance(result, list):
        if len(result) != 1:
            return None, f"the query returned {len(result)} series (one is judged)"
        number = float(result[0]["value"][1])
    else:
        return None, f"the query returned a {data.get('resultType')}, not a number"
    return (None, "the query returned NaN") if math.isnan(number) else (number, "")


def ask(spec: PrometheusSpec, query: str) -> tuple[float | None, str]:
    try:
        answer = httpx.get(spec.address.rstrip("/") + "/api/v1/query", params={"query": query},
                           timeout=spec.timeout_s, trust_env=False)
        return value_of(answer.json())
    except (httpx.HTTPError, ValueError, KeyError, TypeError, IndexError) as err:
        return None, f"Prometheus at {spec.address}: {err}"


def judged(query: PromQuery, text: str, value: float | None, why: str) -> dict:
    """Pure: one query's check, in the shape of bake_checks.judge_check's."""
    result = {"metric": f"promql:{query.name}", "query": text, "value": value, "baseline": None}
    if value is None:
        return {**result, "status": UNJUDGED, "reason": why}
    problems = []
    if query.max is not None and value > query.max:
        problems.append(f"{query.name} {value:.4g} > max {query.max:g}")
    if query.min is not None and value < query.min:
        problems.append(f"{query.name} {value:.4g} < min {query.min:g}")
    return {**result, "status": FAIL if problems else PASS, "reason": "; ".join(problems)}


def checks(spec: PrometheusSpec, host: str, unit: str, ask=ask) -> list[dict]:
    """Every query of the spec, judged for one host."""
    out = []
    for query in spec.queries:
        text = filled(query, host, unit)
        out.append(judged(query, text, *ask(spec, text)))
    return out
