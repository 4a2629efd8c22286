"""Prometheus recording and alert rules for ddops' services, one set of series for every runtime.

Pure: the rollout bake's table (ddops/rollout/fleet/scrape.py `SERIES`: each runtime's names
for requests, errors, tokens, latency histograms and acceptance) in, rule groups out, so a name
lives once and a Prometheus counts the samples a bake counts. Every target ddops renders carries
the labels `TARGET_LABELS` (ddops/monitor/targets.py), `runtime` among them, so each runtime's
part of a rule selects its own targets, and one rule per figure joins the parts with `or`
under one `ddops:*` name:

  ddops:requests:rate5m          generation requests per second
  ddops:error_ratio:rate5m       failed (cancelled included) over all, as the bake counts them
  ddops:cancelled_ratio:rate5m   requests the client left, where the runtime tells (bundled only)
  ddops:tokens_per_second:rate5m completion tokens per second
  ddops:ttft_seconds:p50|p99     time to first token quantiles
  ddops:itl_seconds:p50|p99      time per output token quantiles
  ddops:accept_length:rate5m     tokens a round of the configured width commits (what the draft
                                 accepts): the bundled runtime's histogram of it per request,
                                 vLLM's 1 + accepted / drafts, SGLang's gauge averaged

A runtime that cannot tell a figure has no part in its rule, never a made-up series. Alerts
read only `ddops:*` and `up`.
"""

from __future__ import annotations

from dataclasses import dataclass

from ddops.rollout.fleet.scrape import SERIES, Series

TARGET_LABELS = ("host", "unit", "profile", "runtime", "method", "speculative", "role")
JOBS = 'job=~"ddops(-[0-9a-f]+)?"'   # targets.job_name: one scrape job per API key
BY = ", ".join(TARGET_LABELS)
WINDOW = "5m"
QUANTILES = {"p50": 0.5, "p99": 0.99}
NEAR_ONE = 1.05          # a speculative service whose draft accepts less is speculating for nothing
ERROR_RATIO = 0.05
MIRROR_WINDOW = "15m"    # mirrored T=0 requests come as production's traffic does: a wider window
MIRROR_MIN = 5           # compared requests in it before equality is judged
TTFT_P99_S = 10.0        # without a profile SLO: the bound an interactive chat would not survive


@dataclass(frozen=True)
class Rule:
    record: str
    expr: str

    def as_dict(self) -> dict:
        return {"record": self.record, "expr": self.expr}


def _rate(selector: str) -> str:
    return f"sum by ({BY}) (rate({selector}[{WINDOW}]))"


def _quantile(q: float, histogram: str, runtime: str) -> str:
    return (f"histogram_quantile({q}, sum by ({BY}, le) "
            f"(rate({histogram}_bucket{{runtime=\"{runtime}\"}}[{WINDOW}])))")


def _ratio(numerator: str, denominator: str) -> str:
    return f"({numerator}) / ({denominator} > 0)"


def _acceptance(series: Series, runtime: str) -> str | None:
    where = f'{{runtime="{runtime}"}}'
    if series.accept_histogram:
        return _ratio(_rate(f"{series.accept_histogram}_sum{where}"), _rate(f"{series.accept_histogram}_count{where}"))
    if series.spec_drafts and series.spec_accepted:
        return "1 + " + _ratio(_rate(f"{series.spec_accepted}_total{where}"), _rate(f"{series.spec_drafts}_total{where}"))
    if series.accept_gauge:
        return f"avg by ({BY}) (avg_over_time({series.accept_gauge}{where}[{WINDOW}]))"
    return None


def recording(runtime: str, series: Series) -> list[Rule]:
    """One runtime's rules, each selecting its targets by their `runtime` label."""
    only = f'runtime="{runtime}"'
    requests = _rate(series.requests.selector(only))
    rules = [Rule("ddops:requests:rate5m", requests),
             Rule("ddops:error_ratio:rate5m", _ratio(_rate(series.errors.selector(only)), requests)),
             Rule("ddops:tokens_per_second:rate5m", _rate(f"{series.generated}_total{{{only}}}"))]
    if series.cancelled is not None:
        rules.append(Rule("ddops:cancelled_ratio:rate5m", _ratio(_rate(series.cancelled.selector(only)), requests)))
    for name, histogram in (("ttft_seconds", series.ttft), ("itl_seconds", series.itl)):
        rules += [Rule(f"ddops:{name}:{label}", _quantile(q, histogram, runtime)) for label, q in QUANTILES.items()]
    accept = _acceptance(series, runtime)
    if accept is not None:
        rules.append(Rule("ddops:accept_length:rate5m", accept))
    if series.mirror_compared and series.mirror_equal:
        compared = _increase(f"{series.mirror_compared}_total{{{only}}}")
        rules += [Rule(f"ddops:mirror_compared:increase{MIRROR_WINDOW}", compared),
                  Rule(f"ddops:mirror_equality:ratio{MIRROR_WINDOW}",
                       _ratio(_increase(f"{series.mirror_equal}_total{{{only}}}"), compared))]
    return rules


def _increase(selector: str) -> str:
    return f"sum by ({BY}) (increase({selector}[{MIRROR_WINDOW}]))"


def alert(name: str, expr: str, for_: str, summary: str, severity: str = "warning") -> dict:
    return {"alert": name, "expr": expr, "for": for_, "labels": {"severity": severity},
            "annotations": {"summary": summary}}


def alerts(profiles: dict | None = None) -> list[dict]:
    """What goes wrong with a speculative service: down, a draft that accepts (almost) nothing,
    errors, a shadow whose answers part from production's, slow first tokens; then each
    profile's own bounds (`profiles`: name -> schema.MonitoringSpec), whose TTFT SLO replaces the
    generic bound for its services."""
    own = {name: spec for name, spec in (profiles or {}).items() if spec.ttft_p99_slo_s is not None}
    generic = f'{{profile!~"{"|".join(sorted(own))}"}}' if own else ""
    return [*_common(generic), *(a for name, spec in sorted((profiles or {}).items()) for a in _own(name, spec))]


def _own(name: str, spec) -> list[dict]:
    """One profile's alerts: its break-even accepted length and its TTFT SLO."""
    where, out = f'profile="{name}"', []
    if spec.break_even_accept_length is not None:
        out.append(alert("DdopsBelowBreakEven",
                         f'ddops:accept_length:rate5m{{{where}, speculative="true"}} < {spec.break_even_accept_length:g}',
                         "10m", "{{ $labels.unit }} on {{ $labels.host }}: its draft accepts {{ $value | printf \"%.2f\" }} "
                         f"tokens a round, under {name}'s break-even {spec.break_even_accept_length:g}: plain decoding "
                         "would be faster here"))
    if spec.ttft_p99_slo_s is not None:
        out.append(alert("DdopsTtftOverSlo", f"ddops:ttft_seconds:p99{{{where}}} > {spec.ttft_p99_slo_s:g}", "10m",
                         "{{ $labels.unit }} on {{ $labels.host }}: time to first token p99 {{ $value | humanizeDuration }}"
                         f", over {name}'s SLO of {spec.ttft_p99_slo_s:g} s"))
    return out


def _common(generic_ttft: str) -> list[dict]:
    return [
        alert("DdopsServiceDown", f"up{{{JOBS}}} == 0", "1m",
              "{{ $labels.unit }} on {{ $labels.host }} does not answer its /metrics", "critical"),
        alert("DdopsAcceptanceNearOne", f'ddops:accept_length:rate5m{{speculative="true"}} < {NEAR_ONE}', "2m",
              "{{ $labels.unit }} on {{ $labels.host }} speculates ({{ $labels.method }}) but its draft accepts "
              "{{ $value | printf \"%.2f\" }} tokens a round: the draft no longer matches the target, or the "
              "content is one it cannot predict; plain decoding would be faster"),
        alert("DdopsErrorRatioHigh", f"ddops:error_ratio:rate5m > {ERROR_RATIO}", "5m",
              "{{ $labels.unit }} on {{ $labels.host }}: {{ $value | humanizePercentage }} of generation "
              "requests failed or were abandoned"),
        alert("DdopsShadowDiverges",
              f"ddops:mirror_equality:ratio{MIRROR_WINDOW} < 1 and ddops:mirror_compared:increase{MIRROR_WINDOW} "
              f">= {MIRROR_MIN}", "5m",
              "{{ $labels.unit }} on {{ $labels.host }} (a mirroring shadow) answered "
              "{{ $value | humanizePercentage }} of production's mirrored T=0 requests identically: "
              "the candidate is not lossless against production; do not promote it"),
        alert("DdopsSlowFirstToken", f"ddops:ttft_seconds:p99{generic_ttft} > {TTFT_P99_S}", "10m",
              "{{ $labels.unit }} on {{ $labels.host }}: time to first token p99 {{ $value | humanizeDuration }}"),
    ]


def joined() -> list[Rule]:
    """One rule per figure: every runtime that tells it, its part selecting its own targets."""
    parts: dict[str, list[str]] = {}
    for runtime, series in SERIES.items():
        for rule in recording(runtime, series):
            parts.setdefault(rule.record, []).append(rule.expr)
    return [Rule(record, " or ".join(f"({expr})" for expr in exprs)) for record, exprs in parts.items()]


def rule_file(profiles: dict | None = None) -> dict:
    """The rule file's document: the recording rules, then the alerts (with `profiles`' own)."""
    return {"groups": [{"name": "ddops-recording", "rules": [r.as_dict() for r in joined()]},
                       {"name": "ddops-alerts", "rules": alerts(profiles)}]}
