"""Judge one analysis sample: a host's window figures against the plan's checks (pure).

A sample is `wait` until the window holds `min_requests` generation requests, then `pass` or
`fail`. A check whose figure is missing (no ITL histogram samples yet, no accepted length on a
plain server) or whose ratio has no baseline is `skipped` and never fails the sample. So is a
ratio against a baseline of fewer than `min_requests` requests: the baseline side of a ratio
needs as many observations as the judged side (a loaded baseline host answers fewer probes,
and one fast answer against a cold one is no regression).
"""

from __future__ import annotations

from ddops.profile.analysis import AnalysisSpec, CheckSpec

WAIT, PASS, FAIL = "wait", "pass", "fail"


def judge(spec: AnalysisSpec, window: dict, baseline: dict | None) -> dict:
    """{verdict, checks: [{metric, value, baseline, status, reason}]} for one sample."""
    if (window.get("requests") or 0) < spec.min_requests:
        return {"verdict": WAIT, "checks": [],
                "reason": f"{window.get('requests') or 0:g} of {spec.min_requests} requests so far"}
    thin = thin_baseline(baseline, spec.min_requests)
    checks = [judge_check(check, window.get(check.metric), (baseline or {}).get(check.metric), thin)
              for check in spec.checks]
    failed = any(c["status"] == FAIL for c in checks)
    return {"verdict": FAIL if failed else PASS, "checks": checks}


def thin_baseline(baseline: dict | None, min_requests: int) -> str | None:
    """Why a baseline cannot bear ratios (too few requests), or None when it can or is absent."""
    if baseline is None:
        return None
    requests = baseline.get("requests") or 0
    return f"baseline has {requests:g} of {min_requests} requests" if requests < min_requests else None


def judge_check(check: CheckSpec, value: float | None, base: float | None, thin: str | None = None) -> dict:
    """`thin`: why the baseline is too small to judge ratios against (ratios are then skipped)."""
    result = {"metric": check.metric, "value": value, "baseline": base}
    if value is None:
        return {**result, "status": "skipped", "reason": "no observations in the window"}
    problems = []
    if check.max is not None and value > check.max:
        problems.append(f"{check.metric} {value:.4g} > max {check.max:g}")
    if check.min is not None and value < check.min:
        problems.append(f"{check.metric} {value:.4g} < min {check.min:g}")
    ratio_checks = [(b, op) for b, op in ((check.max_ratio, "max"), (check.min_ratio, "min"))
                    if b is not None]
    if ratio_checks and (base is None or thin):
        if not problems and check.max is None and check.min is None:
            return {**result, "status": "skipped", "reason": thin if base is not None else "no baseline figure"}
    elif ratio_checks:
        problems += _ratio_problems(check.metric, value, base, ratio_checks)
    if problems:
        return {**result, "status": FAIL, "reason": "; ".join(problems)}
    return {**result, "status": PASS, "reason": ""}


def _ratio_problems(metric: str, value: float, base: float, bounds) -> list[str]:
    """value / base against each bound; a zero baseline allows only zero (max) or anything (min)."""
    out = []
    for bound, op in bounds:
        if base == 0:
            if op == "max" and value > 0:
                out.append(f"{metric} {value:.4g} where the baseline is 0")
            continue
        ratio = value / base
        if (op == "max" and ratio > bound) or (op == "min" and ratio < bound):
            sign = ">" if op == "max" else "<"
            out.append(f"{metric} {value:.4g} is {ratio:.2f}x the baseline {base:.4g} ({sign} {op}_ratio {bound:g})")
    return out


def final_verdict(spec: AnalysisSpec, samples: list[dict]) -> dict:
    """The bake's outcome for one host: failed at the first failing sample; otherwise passed
    when some sample was judged; otherwise no traffic, which `on_no_traffic` turns into a
    pass or a failure."""
    for sample in samples:
        if sample.get("verdict") == FAIL:
            reasons = [c["reason"] for c in sample.get("checks", []) if c["status"] == FAIL]
            return {"status": "failed", "passed": False,
                    "reasons": reasons or [sample.get("reason", "failed")]}
    if any(s.get("verdict") == PASS for s in samples):
        return {"status": "passed", "passed": True, "reasons": []}
    passed = spec.on_no_traffic == "pass"
    return {"status": "no_traffic", "passed": passed,
            "reasons": [f"fewer than {spec.min_requests} requests during the bake "
                        f"(on_no_traffic: {spec.on_no_traffic})"]}
