"""CI mode for the rollout commands: output channel, consent, and the exit-code contract.

Three channels: `human` (Rich narration and tables on stdout), `json` (exactly one JSON
document on stdout at the end), `events` (one JSON object per line as things happen, the last
one `{"event": "result", ...}`). In the JSON channels nothing else is written to stdout.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any, Callable

from rich.console import Console

from ddops.exits import BadInput
from ddops.shell import envelope, must_ask, result_event


class Output:
    def __init__(self, json_doc: bool = False, json_events: bool = False,
                 console: Console | None = None, stream=None) -> None:
        if json_doc and json_events:
            raise BadInput("--json and --json-events: choose one")
        self.mode = "json" if json_doc else "events" if json_events else "human"
        self.console = console or Console(highlight=False)
        self.errors = Console(stderr=True, highlight=False) if console is None else console
        self.stream = stream or sys.stdout
        self.events: list[dict] = []

    @property
    def human(self) -> bool:
        return self.mode == "human"

    def event(self, kind: str, message: str = "", **fields: Any) -> None:
        """A stage or host transition; narrated for people, a JSON line for CI."""
        record = {"event": kind, "time": round(time.time(), 3), **fields}
        if message:
            record["message"] = message
        self.events.append(record)
        if self.mode == "events":
            self._write(record)
        elif self.human and message:
            self.console.print(f"[dim]{kind:>7}[/dim]  {message}")

    def show(self, renderable: Any) -> None:
        if self.human:
            self.console.print(renderable)

    def finish(self, code: int, doc: dict, meaning: str | None = None) -> int:
        """Writes the result document (JSON channels) and returns the exit code."""
        body = envelope(code, meaning=meaning, **doc)
        if self.mode == "json":
            self._write(body)
        elif self.mode == "events":
            self._line(result_event(body))
        return code

    def fail(self, code: int, message: str, hint: str = "", **doc: Any) -> int:
        if self.human:
            self.errors.print(f"[red]error:[/red] {message}" + (f"\n[dim]hint: {hint}[/dim]" if hint else ""))
        return self.finish(code, {"error": message, "hint": hint or None, **doc})

    def _write(self, record: dict) -> None:
        self._line(json.dumps(record, default=str))

    def _line(self, text: str) -> None:
        self.stream.write(text + "\n")
        self.stream.flush()


def consent(yes: bool, question: str, out: Output,
            is_tty: Callable[[], bool] = lambda: sys.stdin.isatty()) -> bool:
    """True to go ahead: shell.must_ask's rule, asked on this channel's console."""
    if not must_ask(yes, "apply changes", machine=not out.human, is_tty=is_tty):
        return True
    return out.console.input(f"{question} [y/N] ").strip().lower() in ("y", "yes")
