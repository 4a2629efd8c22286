"""The report of a rollout (its `--json` result or its state file): outcome per host, a
timeline of host transitions and rollout events, each watched host's analysis samples
against baseline and bounds, and the notifications sent."""

from __future__ import annotations

from html import escape

from ddops.report import charts
from ddops.report.page import cell, chart, document, section, table, verdict


def render(doc: dict) -> str:
    timeline = list(doc.get("timeline") or [])
    origin = timeline[0]["time"] if timeline else 0.0
    parts = [_outcome(doc)]
    if timeline:
        parts.append(section("Timeline", chart(charts.timeline(*_lanes(doc, timeline, origin)),
                                               "Each host's status over time; dotted lines are rollout events."),
                             _transitions(timeline, origin)))
    checks = next((e.get("checks") for e in timeline if e.get("event") == "start"), None) or []
    for host, record in (doc.get("analysis") or {}).items():
        parts.append(_analysis(host, record, checks or _checked(record), origin))
    if doc.get("notifications"):
        parts.append(section("Notifications", table(["webhook", "format", "sent", "failed"], [
            [cell(n["webhook"]), cell(n["format"]), cell(n["sent"]), cell("; ".join(n["failed"]))]
            for n in doc["notifications"]])))
    return document(f"Rollout of {doc.get('profile', '?')}: {doc.get('status', '?')}", parts)


def _outcome(doc: dict) -> str:
    rows = []
    for number, wave in enumerate(doc.get("waves") or []):
        label = "canary" if number == 0 and doc.get("canary") else str(number + (not doc.get("canary")))
        for host in wave:
            h = doc["hosts"][host]
            rows.append([cell(label), cell(host), cell(h["status"], "pass" if h["status"] == "done" else
                                                       "fail" if "fail" in h["status"] else ""),
                         cell(h.get("detail", ""))])
    ok = doc.get("status") == "succeeded"
    head = f"<p>{verdict(ok, ('succeeded', escape(str(doc.get('status')))))}"
    if doc.get("exit_code") is not None:
        head += f" (exit {doc['exit_code']}: {escape(str(doc.get('meaning', '')))})"
    return section("Outcome", head + "</p>", table(["wave", "host", "status", "detail"], rows))


def _lanes(doc: dict, timeline: list[dict], origin: float):
    end = timeline[-1]["time"] - origin
    lanes: dict[str, list] = {h: [] for wave in doc.get("waves") or [] for h in wave}
    last: dict[str, tuple[float, str]] = {}
    for entry in timeline:
        host = entry.get("host")
        if host is None or "event" in entry:  # a rollout event naming a host (revert)
            continue
        at = entry["time"] - origin
        if host in last:
            lanes.setdefault(host, []).append((last[host][0], at, last[host][1]))
        last[host] = (at, entry["status"])
    for host, (at, status) in last.items():
        lanes.setdefault(host, []).append((at, end, status))
    for host, spans in lanes.items():
        if not spans:  # never touched
            spans.append((0.0, end, doc["hosts"][host]["status"]))
    marks = [(e["time"] - origin, _event_label(e)) for e in timeline if "event" in e]
    return lanes, marks


def _event_label(entry: dict) -> str:
    wave = entry.get("wave")
    return f"{entry['event']} {wave}" if wave is not None else entry["event"]


def _transitions(timeline: list[dict], origin: float) -> str:
    rows = [[cell(round(e["time"] - origin, 1)), cell(e.get("host", "")),
             cell(e.get("status") or e.get("event")), cell(e.get("detail") or e.get("reason") or "")]
            for e in timeline]
    return ("<details><summary>every transition and event (gate results in the detail)</summary>"
            + table(["s", "host", "status / event", "detail"], rows) + "</details>")


def _checked(record: dict) -> list[dict]:
    """Check metrics as the samples name them (when the result carries no plan)."""
    names = dict.fromkeys(c["metric"] for s in record.get("samples", []) for c in s.get("checks", []))
    return [{"metric": name} for name in names]


def _analysis(host: str, record: dict, checks: list[dict], origin: float) -> str:
    samples = record.get("samples") or []
    first = samples[0]["time"] if samples else origin
    rows = [{**s, "t": round(s["time"] - first, 1)} for s in samples]
    final = record.get("verdict") or {}
    head = (f"<p>verdict: {verdict(bool(final.get('passed')), (final.get('status', 'passed'), final.get('status', 'failed')))}"
            f" {escape('; '.join(final.get('reasons', [])))}</p>")
    body = [[cell(r["t"]), cell((r.get("window") or {}).get("requests")), cell(r["verdict"], r["verdict"]),
             cell("; ".join(c["reason"] for c in r.get("checks", []) if c["reason"]) or r.get("reason", ""))]
            for r in rows]
    parts = [head]
    if rows:
        parts.append(chart(charts.samples(host, rows, checks),
                           "Window figures per sample (green pass, red fail, grey waiting for traffic); "
                           "dashed: baseline; dotted: absolute bound."))
    parts.append(table(["s", "requests", "verdict", "reasons"], body))
    return section(f"Analysis of {host}", *parts)
