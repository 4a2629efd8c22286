"""The report of a mirrored comparison (`shadow compare --mirrored` result): verdict, what
production copied and what the shadow compared, the shadow's figures on that traffic, the
sampled-request distributions, and the redacted samples when any were kept."""

from __future__ import annotations

from html import escape

from ddops.report import charts
from ddops.report.page import cell, chart, document, section, table, verdict


def render(doc: dict) -> str:
    comparison = doc["comparison"]
    return document("Mirrored shadow comparison", [
        _verdict(doc, comparison),
        section("Mirrored requests", _counts(comparison)),
        section("The shadow on mirrored traffic", _shadow(comparison["shadow"])),
        section("Sampled requests (by distribution)", _distribution(comparison["distribution"])),
        section("Samples", _samples(comparison.get("samples") or [])),
    ])


def _verdict(doc: dict, comparison: dict) -> str:
    judged = doc.get("verdict") or {}
    reasons = "".join(f"<li>{escape(r)}</li>" for r in judged.get("reasons", []))
    equality, by_text = comparison["token_equality"], comparison.get("text_equality")
    shown = "-" if equality is None else f"{equality:.3f}"
    if by_text is not None:
        shown += f", text equality {by_text:.3f}"
    urls = f"production {doc.get('production_url', '')}, shadow {doc.get('shadow_url', '')}"
    return section("Verdict", f"<p>{verdict(bool(judged.get('passed')))}: token equality {shown} over "
                   f"{comparison['mirrored']['requests']} mirrored requests ({escape(urls)})</p>"
                   f"<ul>{reasons}</ul>")


def _counts(comparison: dict) -> str:
    m, det = comparison["mirrored"], comparison["deterministic"]
    keys = ("offered", "sent", "dropped", "failed", "requests")
    rows = [[cell("production tap / shadow"), *(cell(m[k]) for k in keys)]]
    det_keys = ("requests", "equal", "matched_tokens", "compared_tokens", "token_equality")
    text = comparison.get("text") or {}
    text_keys = ("requests", "equal", "matched_chars", "compared_chars", "text_equality")
    by_text = (table(["deterministic, compared by text (production logged text only)", *text_keys],
                     [[cell(""), *(cell(text[k]) for k in text_keys)]]) if text.get("requests") else "")
    return (table(["", *keys], rows) +
            table(["deterministic (T=0 or seeded)", *det_keys], [[cell(""), *(cell(det[k]) for k in det_keys)]]) +
            by_text)


def _shadow(shadow: dict) -> str:
    keys = ("accept_length", "ttft_p50_s", "ttft_p95_s", "itl_p50_s", "itl_p95_s", "tokens_per_s")
    figures = chart(charts.bars({"accepted length": {"shadow": shadow["accept_length"]},
                                 "tokens/s": {"shadow": shadow["tokens_per_s"]}},
                                "the shadow's acceptance and speed on mirrored requests"),
                    "Mean tokens committed per verify round; completion tokens per generation second.")
    return figures + table(list(keys), [[cell(shadow[k]) for k in keys]])


def _distribution(dist: dict) -> str:
    rows = [[cell(side), cell(d["requests"]), cell(d["mean_length"]),
             cell(", ".join(f"{k}: {v}" for k, v in sorted(d["finish_reasons"].items())))]
            for side, d in dist.items()]
    return table(["", "requests", "mean length", "finish reasons"], rows)


def _samples(samples: list[dict]) -> str:
    if not samples:
        return "<p>No samples kept (mirroring started without --sample).</p>"
    rows = [[f"<td class=\"text\">{escape(s[k])}</td>" for k in ("prompt", "production", "shadow")]
            for s in samples]
    return table(["prompt", "production", "shadow"], rows)
