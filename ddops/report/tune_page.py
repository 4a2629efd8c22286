"""The page of a `ddops tune` result: the chosen candidate, the throughput/latency frontier,
every candidate's figures, and what was skipped or pruned and why."""

from __future__ import annotations

from ddops.report import charts
from ddops.report.page import cell, chart, document, section, table


def render(doc: dict) -> str:
    tune, rows = doc["tune"], doc["rows"]
    chosen = doc.get("chosen")
    title = f"ddops tune {tune['profile']} on {tune['host']}"
    head = (f"<p>Objective: {tune['objective']}, as a multiple of production ({tune['production_unit']}) "
            f"measured in the same run, geometric mean over concurrency "
            f"{', '.join(map(str, tune['levels']))}; {tune['prompts']} prompts x {tune['max_tokens']} tokens; "
            f"search {tune['search']}; wall time {doc['wall_s']} s.</p>")
    verdict = (f"<p class=\"pass\">Chosen: {chosen['label']} ({chosen['objective']:.2f}x production); "
               f"tuned profile {doc.get('tuned_profile')}</p>" if chosen
               else "<p class=\"fail\">No candidate met the requirements.</p>")
    return document(title, [section("Result", head, verdict), _chart(doc, rows), _table(rows, doc),
                            _reasons(rows)])


def _chart(doc: dict, rows: list[dict]) -> str:
    best = set(doc.get("frontier") or [])
    points = [(r["label"], r["levels"][-1]["tokens_per_s"], r["levels"][-1]["itl_p50_s"], r["label"] in best)
              for r in rows if r["status"] in ("measured", "chosen") and r["levels"]
              and r["levels"][-1].get("tokens_per_s") and r["levels"][-1].get("itl_p50_s")]
    if not points:
        return ""
    top = doc["production"][-1]
    prod = (top["tokens_per_s"], top["itl_p50_s"]) if top.get("tokens_per_s") and top.get("itl_p50_s") else None
    svg = charts.frontier(points, prod, f"at concurrency {top['concurrency']} (green: the frontier)")
    return section("Throughput and latency",
                   chart(svg, "each measured candidate; none on the frontier is beaten on both axes"))


def _table(rows: list[dict], doc: dict) -> str:
    levels = [lv["concurrency"] for lv in doc["production"]]
    headers = ["candidate", "status", "x production"] + \
        [f"{what} c={c}" for c in levels for what in ("tok/s", "ITL p50 ms", "TTFT p99 ms", "equal")] + \
        ["accept length"]
    body = [[cell("production"), cell("reference"), cell(1.0)] +
            [x for lv in doc["production"] for x in _level_cells(lv)] + [cell(None)]]
    for r in rows:
        by_c = {lv["concurrency"]: lv for lv in r["levels"]}
        cells = [cell(r["label"]), cell(r["status"], "pass" if r["status"] == "chosen" else ""),
                 cell(r["objective"])]
        for c in levels:
            cells += _level_cells(by_c.get(c)) if c in by_c else [cell(None)] * 4
        body.append(cells + [cell(r["accept_length"])])
    return section("Candidates", table(headers, body))


def _level_cells(lv: dict) -> list[str]:
    ms = lambda v: None if v is None else round(v * 1000, 1)   # noqa: E731
    return [cell(lv.get("tokens_per_s")), cell(ms(lv.get("itl_p50_s"))), cell(ms(lv.get("ttft_p99_s"))),
            cell(lv.get("token_equality"))]


def _reasons(rows: list[dict]) -> str:
    told = [[cell(r["label"]), cell(r["status"]), cell(r["reason"], "text")] for r in rows if r.get("reason")]
    return section("Skipped, pruned, not started, unmet: why", table(["candidate", "status", "reason"], told)) \
        if told else ""
