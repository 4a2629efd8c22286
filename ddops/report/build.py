"""Pick the page for a result document and write it."""

from __future__ import annotations

import json
from pathlib import Path

from ddops import exits


class ReportError(exits.BadInput, ValueError):
    """The file is not a result ddops can report on (bad input)."""


def kind_of(doc: object) -> str:
    if isinstance(doc, dict) and isinstance(doc.get("tune"), dict) and isinstance(doc.get("rows"), list):
        return "tune"
    if isinstance(doc, dict) and isinstance(doc.get("comparison"), dict):
        return "shadow"
    if isinstance(doc, dict) and "waves" in doc and isinstance(doc.get("hosts"), dict):
        return "rollout"
    raise ReportError("not a shadow comparison, rollout or tune result (expected `comparison`, `waves` and `hosts`, or `tune` and `rows`)")


def render(doc: dict) -> str:
    if kind_of(doc) == "shadow" and "mirrored" in doc["comparison"]:
        from ddops.report import mirror_page
        return mirror_page.render(doc)
    if kind_of(doc) == "tune":
        from ddops.report import tune_page
        return tune_page.render(doc)
    if kind_of(doc) == "shadow":
        from ddops.report import shadow_page
        return shadow_page.render(doc)
    from ddops.report import rollout_page
    return rollout_page.render(doc)


def write_report(result: Path, out: Path | None = None) -> Path:
    """Writes the HTML (default: beside the result, .html) and returns its path."""
    try:
        doc = json.loads(Path(result).read_text())
    except OSError as exc:
        raise ReportError(f"{result}: cannot read ({exc.strerror})") from None
    except ValueError as exc:
        raise ReportError(f"{result}: not JSON ({exc})") from None
    try:
        page = render(doc)
    except ReportError as exc:
        raise ReportError(f"{result}: {exc}") from None
    target = Path(out) if out else Path(result).with_suffix(".html")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(page)
    return target
