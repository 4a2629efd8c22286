"""`ddops report RESULT.json [--html OUT.html]`: a self-contained HTML page for a shadow
comparison or a rollout result."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer


def report_command(
    result: Annotated[Path, typer.Argument(metavar="RESULT.json", help="A `shadow compare` or `rollout` result (or a rollout state file).")],
    html: Annotated[Optional[Path], typer.Option("--html", help="Where to write the page (default: RESULT.html beside the result).")] = None,
) -> None:
    """Write an HTML report (charts inline, opens without network) and print its path."""
    from ddops.report.build import write_report
    print(write_report(result, html))     # ReportError (exit 2) reaches the shell's one mapping


def register(app: typer.Typer) -> None:
    app.command("report")(report_command)
