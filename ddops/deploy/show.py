"""Narration for the deploy and operate commands: stage lines, the plan table and diffs,
gate progress, the result. Text only; `--json` callers use the objects' as_dict instead."""

from __future__ import annotations

import sys

from rich.console import Console
from rich.markup import escape
from rich.syntax import Syntax
from rich.table import Table

from ddops.deploy.apply import Outcome
from ddops.deploy.plan import Plan

# CI logs are not terminals: keep lines whole instead of rich's 80-column default
console = Console(highlight=False, soft_wrap=True, width=None if sys.stdout.isatty() else 200)
errors = Console(stderr=True, highlight=False, soft_wrap=True, width=None if sys.stderr.isatty() else 200)

RESULT_STYLE = {"deployed": "green", "unchanged": "green", "reverted": "yellow",
                "failed": "red", "revert-failed": "bold red", "locked": "red"}


def stage(name: str, text: str = "") -> None:
    console.print(f"[bold]--> {name}[/bold] {escape(text)}")


def plan(p: Plan) -> None:
    if p.noop:
        console.print(f"    no change: {p.desired.unit_name} already runs {p.desired.profile}; "
                      "nothing will be restarted")
        return
    table = Table(show_header=True, header_style="bold", box=None, padding=(0, 2))
    table.add_column("#")
    table.add_column("step")
    table.add_column("detail")
    for i, step in enumerate(p.steps, 1):
        table.add_row(str(i), step.action, escape(step.detail))
    console.print(table)
    for diff in (p.unit_diff, p.env_diff):
        if diff:
            console.print(Syntax(diff, "diff", theme="ansi_dark", background_color="default"))
    for refusal in p.refusals:
        console.print(f"    [red]cannot start[/red] {escape(str(refusal))}")


class _Spinner:
    """On a terminal, a live status line for the check that is running (health can take minutes)."""

    def __init__(self):
        self.status = None

    def update(self, text: str) -> None:
        if not console.is_terminal:
            return
        if self.status is None:
            self.status = console.status(text)
            self.status.start()
        else:
            self.status.update(text)

    def stop(self) -> None:
        if self.status is not None:
            self.status.stop()
            self.status = None


_spinner = _Spinner()


def progress(stage_name: str, text: str) -> None:
    marks = {"ok": "[green]ok[/green]", "failed": "[red]FAILED[/red]"}
    if text in marks:
        _spinner.stop()
        console.print(f"    {stage_name:<12} {marks[text]}")
    elif text == "running" or text.startswith("waiting"):
        _spinner.update(f"{stage_name}: {text}")
    else:
        _spinner.stop()
        console.print(f"    {stage_name:<12} {escape(text)}")


def outcome(o: Outcome) -> None:
    for note in o.notes:
        console.print(f"    note: {escape(note)}")
    if o.gate:
        for check in o.gate.checks:
            mark = "[green]ok[/green]" if check.ok else "[red]FAILED[/red]"
            console.print(f"    {check.name:<12} {mark} {check.seconds:>6.1f}s  {escape(check.detail)}")
    for finding in o.findings[:3]:
        console.print(f"    [yellow]diagnosis[/yellow] {finding.cause}: {escape(finding.summary)}")
        console.print(f"              next: {escape(finding.next_step)}")
        console.print(f"              seen: {escape(finding.evidence)}")
    style = RESULT_STYLE.get(o.result, "bold")
    console.print(f"[{style}]{o.host}: {o.result}[/{style}] - {escape(o.message)} (exit {o.code})")
    if o.entry:
        console.print(f"    history entry {o.entry}")


def error(message: str, hint: str = "") -> None:
    errors.print(f"[red]error:[/red] {escape(message)}")
    if hint:
        errors.print(f"  hint: {escape(hint)}")
