"""`ddops switch`, `ddops shadow ...`, `ddops rollout`: parse, call ddops.rollout, print, exit.

Every mutating command takes --yes, --json and --json-events (docs/ci.md); bad input exits 2
before any host is touched.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Callable, Optional

import typer

from ddops.rollout.ci import BAD_INPUT, GATE_FAILED, OK, BadInput, Output

Yes = Annotated[bool, typer.Option("--yes", "-y", help="Apply without asking (required without a TTY).")]
Json = Annotated[bool, typer.Option("--json", help="Print one JSON document at the end.")]
Events = Annotated[bool, typer.Option("--json-events", help="Print JSON lines of events as they happen.")]
Host = Annotated[str, typer.Option("--host", help="Inventory host name.")]
Inventory = Annotated[Optional[Path], typer.Option("--inventory", help="Inventory file (default: $DDOPS_INVENTORY or lab/inventory.yaml).")]

shadow_app = typer.Typer(no_args_is_help=True, help="Run a candidate profile beside production and compare.")


def _bad_input_types() -> tuple[type, ...]:
    from ddops.profile import ConfigError
    from ddops.rollout.prompts import PromptFileError
    from ddops.rollout.waves import PlanError
    return (BadInput, ConfigError, PromptFileError, PlanError, ValueError)


def _run(out: Output, body: Callable[[Output], int]) -> None:
    """Runs a command body; bad input becomes exit 2 with one line, in every channel."""
    try:
        code = body(out)
    except _bad_input_types() as exc:
        code = out.fail(BAD_INPUT, _one_line(exc))
    raise typer.Exit(code)


def _one_line(exc: Exception) -> str:
    problems = getattr(exc, "problems", None)
    return "; ".join(problems) if problems else str(exc).splitlines()[0] if str(exc) else type(exc).__name__


def _output(json_doc: bool, json_events: bool) -> Output:
    try:
        return Output(json_doc, json_events)
    except BadInput as exc:
        Output().fail(BAD_INPUT, str(exc))
        raise typer.Exit(BAD_INPUT) from None


@shadow_app.command("compare")
def shadow_compare(
    prompts: Annotated[Optional[Path], typer.Option("--prompts", help="YAML/JSON(L) prompt file (default: the shipped set).")] = None,
    count: Annotated[int, typer.Option("--count", help="Prompts to replay (1..1000; the set repeats if shorter).")] = 12,
    concurrency: Annotated[int, typer.Option("--concurrency", help="Requests in flight per endpoint (1..32).")] = 2,
    max_tokens: Annotated[int, typer.Option("--max-tokens", help="Tokens generated per prompt.")] = 32,
    production_url: Annotated[Optional[str], typer.Option("--production-url", help="Compare this endpoint instead of the recorded production.")] = None,
    shadow_url: Annotated[Optional[str], typer.Option("--shadow-url", help="Compare this endpoint instead of the recorded shadow.")] = None,
    profile: Annotated[Optional[str], typer.Option("--profile", help="Profile whose rollout policy judges (default: the shadow's).")] = None,
    results_dir: Annotated[Optional[Path], typer.Option("--results-dir", help="Where to save the JSON result (default: $DDOPS_STATE/results).")] = None,
    json_doc: Json = False, json_events: Events = False,
) -> None:
    """Replay prompts to production and the shadow at temperature 0 and judge the shadow."""
    from ddops.rollout import tables
    from ddops.rollout.compare import Settings
    from ddops.rollout.shadow import run_compare

    def body(out: Output) -> int:
        settings = Settings(count=count, concurrency=concurrency, max_tokens=max_tokens)
        out.event("stage", f"replaying {count} prompts to production, then to the shadow")
        run = run_compare(prompts_path=prompts, settings=settings, production_url=production_url,
                          shadow_url=shadow_url, profile_name=profile, results_dir=results_dir)
        out.show(tables.prompts_table(run.comparison))
        out.show(tables.totals_table(run.comparison))
        out.show(tables.verdict_table(run.verdict))
        out.event("stage", f"results saved to {run.results_file}")
        return out.finish(OK if run.verdict.passed else GATE_FAILED, run.to_dict())

    _run(_output(json_doc, json_events), body)


def register(app: typer.Typer) -> None:
    app.add_typer(shadow_app, name="shadow")
