"""Rich table of a fleet rollout's progress, one row per host; no logic beyond formatting."""

from __future__ import annotations

from rich.table import Table

STATUS_STYLE = {"pending": "dim", "running": "yellow", "done": "green", "failed": "red", "refused": "red",
                "reverted": "magenta", "revert-failed": "bold red", "locked": "red", "unreachable": "red"}


def hosts_table(state, title: str = "Rollout") -> Table:
    """One row per host in wave order: the live progress view and the final summary."""
    table = Table(title=f"{title}: {state.profile} ({state.status})")
    for column in ("wave", "host", "status", "detail"):
        table.add_column(column)
    for number, wave in enumerate(state.waves):
        label = "canary" if number == 0 and state.canary else str(number + (not state.canary))
        for host in wave:
            h = state.hosts[host]
            style = STATUS_STYLE.get(h.status, "")
            table.add_row(label, host, f"[{style}]{h.status}[/]" if style else h.status, h.detail)
    return table
