"""Rich tables of a shadow comparison and its verdict; no logic beyond formatting."""

from __future__ import annotations

from rich.table import Table

from ddops.rollout.shadow.judge import Verdict
from ddops.rollout.shadow.stats import EndpointSummary

def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.0f} ms"


def _num(value: float | None, fmt: str = "{:.1f}") -> str:
    return "-" if value is None else fmt.format(value)


def prompts_table(comparison) -> Table:
    table = Table(title="Per prompt (temperature 0)")
    for column in ("prompt", "equal", "agreement", "differs at", "prod latency", "shadow latency",
                   "prod TTFT", "shadow TTFT", "tokens"):
        table.add_column(column, justify="left" if column == "prompt" else "right")
    prod, shadow = comparison.samples["production"], comparison.samples["shadow"]
    for a, p, s in zip(comparison.agreements, prod, shadow):
        share = a.matched / a.compared if a.compared else 1.0
        table.add_row(a.prompt_id, "[green]yes[/]" if a.equal else "[red]no[/]",
                      f"{share:.0%} ({a.matched}/{a.compared} {a.unit})",
                      "-" if a.first_divergence is None else f"{a.unit} {a.first_divergence}",
                      _ms(p.latency_s),
                      _ms(s.latency_s), _ms(p.ttft_s), _ms(s.ttft_s),
                      f"{p.completion_tokens}/{s.completion_tokens}")
    return table


def totals_table(comparison) -> Table:
    table = Table(title=f"Totals: token equality {comparison.token_equality:.2%}, "
                        f"{comparison.prompts_equal}/{len(comparison.agreements)} prompts identical")
    table.add_column("")
    for name in ("production", "shadow"):
        table.add_column(name, justify="right")
    rows: list[tuple[str, callable]] = [
        ("requests / errors", lambda e: f"{e.requests} / {e.errors}"),
        ("latency p50", lambda e: _ms(e.latency_p50_s)),
        ("latency p95", lambda e: _ms(e.latency_p95_s)),
        ("TTFT p50", lambda e: _ms(e.ttft_p50_s)),
        ("TTFT p95", lambda e: _ms(e.ttft_p95_s)),
        ("tokens/s", lambda e: _num(e.tokens_per_s)),
        ("accepted length", lambda e: _num(e.accept_length, "{:.2f}")),
    ]
    pair: tuple[EndpointSummary, EndpointSummary] = (comparison.production, comparison.shadow)
    for label, cell in rows:
        table.add_row(label, *(cell(e) for e in pair))
    return table


def verdict_table(verdict: Verdict) -> Table:
    title = "[green]Verdict: PASS[/]" if verdict.passed else "[red]Verdict: FAIL[/]"
    table = Table(title=title)
    for column in ("check", "result", "required", "detail"):
        table.add_column(column)
    for check in verdict.checks:
        table.add_row(check.name, "[green]pass[/]" if check.passed else "[red]fail[/]",
                      check.required, check.reason)
    return table


def mirrored_table(mirrored) -> Table:
    """Production's tap counts and the shadow's comparison of the mirrored requests."""
    doc = mirrored.to_dict()
    m, det, shadow = doc["mirrored"], doc["deterministic"], doc["shadow"]
    equality = det["token_equality"]
    table = Table(title=f"Mirrored traffic: {m['requests']} requests compared, token equality "
                        f"{'-' if equality is None else f'{equality:.2%}'}")
    table.add_column("")
    table.add_column("value", justify="right")
    dist = doc["distribution"]
    rows = [("offered / sent by production", f"{m['offered']} / {m['sent']}"),
            ("dropped / failed", f"{m['dropped']} / {m['failed']}"),
            ("deterministic: equal / requests", f"{det['equal']} / {det['requests']}"),
            ("matched / compared tokens", f"{det['matched_tokens']} / {det['compared_tokens']}"),
            ("by text: equal / requests, chars", f"{doc['text']['equal']} / {doc['text']['requests']}, "
                                                 f"{doc['text']['matched_chars']} / {doc['text']['compared_chars']}"),
            ("sampled: mean length prod / shadow",
             f"{_num(dist['production']['mean_length'])} / {_num(dist['shadow']['mean_length'])}"),
            ("shadow accepted length", _num(shadow["accept_length"], "{:.2f}")),
            ("shadow TTFT p50 / p95", f"{_ms(shadow['ttft_p50_s'])} / {_ms(shadow['ttft_p95_s'])}"),
            ("shadow ITL p50 / p95", f"{_ms(shadow['itl_p50_s'])} / {_ms(shadow['itl_p95_s'])}"),
            ("shadow tokens/s", _num(shadow["tokens_per_s"]))]
    for label, value in rows:
        table.add_row(label, value)
    return table
