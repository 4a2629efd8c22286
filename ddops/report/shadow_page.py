"""The report of a shadow comparison (`shadow compare` result): verdict, latency and TTFT
distributions of production vs shadow, tokens/s and accepted length, and every prompt with
the point where the two outputs first differ, in context."""

from __future__ import annotations

from html import escape

from ddops.report import charts
from ddops.report.page import cell, chart, document, section, table, verdict

ENDPOINTS = ("production", "shadow")
CONTEXT = 40  # characters shown before the first difference
AFTER = 40  # and after it, on each side


def render(doc: dict) -> str:
    comparison = doc["comparison"]
    rows = comparison["per_prompt"]
    return document("Shadow comparison", [
        _verdict(doc, comparison),
        section("Latency", chart(charts.distributions({
            "latency": {e: _values(rows, e, "latency_s") for e in ENDPOINTS},
            "time to first token": {e: _values(rows, e, "ttft_s") for e in ENDPOINTS}},
            "per-request latency, production vs shadow"), "Histograms of every request.")),
        section("Speed and acceptance", chart(charts.bars({
            "tokens/s": {e: comparison[e]["tokens_per_s"] for e in ENDPOINTS},
            "accepted length": {e: comparison[e]["accept_length"] for e in ENDPOINTS}},
            "throughput and speculative acceptance"),
            "Completion tokens per second of each phase; mean tokens committed per verify round."),
            _totals(comparison)),
        section("Prompts", _prompts(rows)),
    ])


def _values(rows: list[dict], endpoint: str, key: str) -> list[float]:
    return [r[endpoint][key] for r in rows if r[endpoint].get(key) is not None]


def _verdict(doc: dict, comparison: dict) -> str:
    judged = doc.get("verdict") or {}
    reasons = "".join(f"<li>{escape(r)}</li>" for r in judged.get("reasons", []))
    urls = f"production {doc.get('production_url', '')}, shadow {doc.get('shadow_url', '')}"
    return section("Verdict", f"<p>{verdict(bool(judged.get('passed')))}: token equality "
                   f"{comparison['token_equality']:.3f}, {comparison['prompts_equal']} of "
                   f"{comparison['prompts']} prompts identical ({escape(urls)})</p><ul>{reasons}</ul>")


def _totals(comparison: dict) -> str:
    keys = ["requests", "errors", "latency_p50_s", "latency_p95_s", "ttft_p50_s", "ttft_p95_s",
            "completion_tokens", "tokens_per_s", "accept_length"]
    return table(["", *keys], [[cell(e), *(cell(comparison[e].get(k)) for k in keys)] for e in ENDPOINTS])


def _prompts(rows: list[dict]) -> str:
    body = []
    for r in rows:
        production, shadow = r["production"]["text"] or "", r["shadow"]["text"] or ""
        at = first_difference(production, shadow)
        body.append([cell(r["prompt_id"]), f"<td>{verdict(r['equal'], ('equal', 'differs'))}</td>",
                     cell(_prefix(r)),
                     _in_context(production, at), _in_context(shadow, at)])
    return table(["prompt", "", "common prefix", "production", "shadow"], body)


def _prefix(row: dict) -> str:
    """The common prefix, and where the outputs first differ (older results lack the field)."""
    common = f"{row['matched']} / {row['compared']} {row['unit']}s"
    at = row.get("first_divergence")
    return common if at is None else f"{common}; first differs at {row['unit']} {at}"


def first_difference(a: str, b: str) -> int | None:
    """Index of the first differing character; None when the texts are equal."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def _in_context(text: str, at: int | None) -> str:
    if at is None:
        return f"<td class=\"text same\">{escape(text[:CONTEXT + AFTER])}</td>"
    start = max(0, at - CONTEXT)
    before = ("…" if start else "") + text[start:at]
    differing = text[at:at + AFTER] or "(ends here)"
    return (f"<td class=\"text\"><span class=\"same\">{escape(before)}</span>"
            f"<mark>{escape(differing)}</mark></td>")
