"""The shell every ddops command runs in: global options, the report of an exception that
escapes a command (its exit code from ddops.exits, the one table), and the JSON envelope every
`--json` document shares.

Results go to stdout; narration, errors and hints go to stderr (in the JSON channels the error
is also in the document). A traceback is shown only with the global `--debug`.
"""

from __future__ import annotations

import functools
import inspect
import json
import sys
import traceback
import typing
from dataclasses import dataclass
from typing import Any, Callable

import typer
from pydantic import BaseModel, ConfigDict, Field

from ddops import exits

SCHEMA_VERSION = 1


def must_ask(yes: bool, doing: str, *, machine: bool = False, dry_run: bool = False,
             is_tty: Callable[[], bool] = lambda: sys.stdin.isatty()) -> bool:
    """The one consent rule of every command that changes a host, checked before it connects:
    --yes (or --dry-run, which changes nothing) goes ahead unasked; otherwise a person at a
    terminal is asked (True), and without a terminal (CI, cron, a pipe) or on a JSON channel,
    which never prompts, the command refuses with exit 2 before touching anything."""
    if yes or dry_run:
        return False
    if machine or not is_tty():
        where = "a JSON channel never prompts" if machine else "no terminal to confirm on"
        raise exits.BadInput(f"refusing to {doing} without --yes: {where}; pass --yes (CI) or --dry-run where there is one")
    return True


def confirm(question: str, ask=lambda q: typer.confirm(q, default=False)) -> None:
    """Ask at the terminal; a no is bad input (exit 2) and nothing changed."""
    if not ask(question):
        raise exits.BadInput("declined at the prompt; nothing changed")


@dataclass
class Options:
    debug: bool = False
    events: bool = False    # --json-events: the result document is one `{"event": "result", ...}` line


OPTIONS = Options()


class Envelope(BaseModel):
    """What every JSON document of ddops starts with; the command's own fields follow."""

    model_config = ConfigDict(extra="allow")

    schema_version: int = SCHEMA_VERSION
    ok: bool
    exit_code: int = Field(description="; ".join(f"{code}: {words}" for code, words in exits.MEANING.items()),
                           json_schema_extra={"enum": sorted(exits.MEANING)})
    meaning: str = Field(description="the exit code's meaning in words, from the same table (fit says "
                                     "fits / does not fit, shadow compare verdict passed / failed)")
    error: str | None = None
    hint: str | None = None


def envelope(code: int, error: str | None = None, hint: str | None = None, meaning: str | None = None,
             **fields: Any) -> dict:
    """One JSON document: the envelope (validated) and then the command's fields."""
    head = Envelope(ok=code == exits.OK, exit_code=code, meaning=meaning or exits.meaning(code),
                    error=error, hint=hint)
    return {**head.model_dump(), **{k: v for k, v in fields.items() if k not in Envelope.model_fields}}


def result_event(doc: dict) -> str:
    """The JSON Lines channel's last line: the result document as a `result` event."""
    return json.dumps({"event": "result", **doc}, default=str)


def print_json(code: int, **fields: Any) -> None:
    doc = envelope(code, **fields)
    print(result_event(doc) if OPTIONS.events else json.dumps(doc, indent=1, default=str))


def with_events(command: Callable) -> Callable:
    """Give a command that prints one JSON document (`as_json`) the `--json-events` channel too:
    the same document as the JSON Lines channel's final `result` event. Commands with events of
    their own (the rollout commands) declare the option themselves and are left as they are."""
    signature = inspect.signature(command)
    if "as_json" not in signature.parameters or "json_events" in signature.parameters:
        return command
    option = inspect.Parameter("json_events", inspect.Parameter.KEYWORD_ONLY, annotation=bool,
                               default=typer.Option(False, "--json-events",
                                                    help="Print the result as one JSON line event."))

    @functools.wraps(command)
    def evented(*args, json_events: bool = False, **kwargs):
        OPTIONS.events = json_events
        if json_events:
            kwargs["as_json"] = True
        return command(*args, **kwargs)
    # the command's annotations may be strings (postponed evaluation): resolve them against its
    # own module, or Typer would look them up in this one
    hints = typing.get_type_hints(command, include_extras=True)
    params = [p.replace(annotation=hints.get(p.name, p.annotation)) for p in signature.parameters.values()]
    evented.__signature__ = signature.replace(parameters=[*params, option])
    evented.__annotations__ = {**hints, "json_events": bool}
    return evented


def classify(exc: BaseException) -> tuple[int, str, bool]:
    """Exit code, hint, and whether ddops expects this kind of failure (else: a bug, shown with
    its type). The code comes from the one table, exits.CAUSES."""
    found = exits.cause_of(exc)
    if found is None:
        return exits.INTERNAL, "a bug in ddops: rerun with --debug for the traceback and report it", False
    code, hint = found
    return code, hint, True


def one_line(exc: BaseException) -> str:
    problems = getattr(exc, "problems", None)
    if problems:
        return "; ".join(problems)
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def guard(command: Callable) -> Callable:
    """Wrap a command so any exception it lets escape becomes its exit code (ddops.cli applies it
    to every command). Typer reads the wrapped signature through functools.wraps."""
    @functools.wraps(command)
    def guarded(*args, **kwargs):
        try:
            return command(*args, **kwargs)
        except (typer.Exit, typer.Abort):
            raise
        except Exception as exc:
            if OPTIONS.debug or kwargs.get("debug"):
                traceback.print_exc()  # then the same exit code as without --debug
            channel = "events" if kwargs.get("json_events") or OPTIONS.events else \
                "json" if kwargs.get("as_json") or kwargs.get("json_doc") else "human"
            raise typer.Exit(report(exc, channel)) from None
    return guarded


def report(exc: BaseException, channel: str = "human") -> int:
    """Print an escaped exception the way every command prints errors; return its exit code.
    channel: human (stderr only), json (one document on stdout), events (a final result line)."""
    code, hint, expected = classify(exc)
    message = one_line(exc) if expected else f"{type(exc).__name__}: {one_line(exc)}"
    problems = list(getattr(exc, "problems", None) or [])
    if channel != "human":
        doc = envelope(code, error=message, hint=hint or None, **getattr(exc, "fields", {}),
                       **({"problems": problems} if problems else {}))
        print(result_event(doc) if channel == "events" else json.dumps(doc, default=str))
    for line in problems or [f"error: {message}"]:
        print(line, file=sys.stderr)
    if hint:
        print(f"hint: {hint}", file=sys.stderr)
    return code


if __name__ == "__main__":  # python -m ddops.shell > docs/cli-envelope.schema.json
    print(json.dumps(Envelope.model_json_schema(), indent=2))
