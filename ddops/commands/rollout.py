"""`ddops switch`, `ddops shadow ...`, `ddops rollout`: parse, call ddops.rollout, print, exit.

Every mutating command takes --yes, --json and --json-events (docs/ci.md); bad input exits 2
before any host is touched.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Callable, Optional

import typer

from ddops import exits
from ddops.exits import BadInput
from ddops.rollout.output import Output

Yes = Annotated[bool, typer.Option("--yes", "-y", help="Apply without asking (required without a TTY).")]
Json = Annotated[bool, typer.Option("--json", help="Print one JSON document at the end.")]
Events = Annotated[bool, typer.Option("--json-events", help="Print JSON lines of events as they happen.")]
Host = Annotated[str, typer.Option("--host", help="Inventory host name.")]
DryRun = Annotated[bool, typer.Option("--dry-run", help="Show the steps it would run; change nothing.")]
Force = Annotated[bool, typer.Option("--force", help="Apply even when planning knows it cannot start (recorded in history).")]
Inventory = Annotated[Optional[Path], typer.Option("--inventory", "-i", help="Inventory file (default: $DDOPS_INVENTORY or lab/inventory.yaml).")]

shadow_app = typer.Typer(no_args_is_help=True, help="Run a candidate profile beside production and compare.")


def _run(out: Output, body: Callable[[Output], int]) -> None:
    """Runs a command body and exits with its code. Bad input (exit 2), an unreachable host
    (exit 6) and an SSH failure after the first contact (exit 3: the host may be mid-change)
    escape to ddops.shell.guard, which reports them in the command's channel."""
    raise typer.Exit(body(out))


def _output(json_doc: bool, json_events: bool) -> Output:
    try:
        return Output(json_doc, json_events)
    except BadInput as exc:
        Output().fail(exits.BAD_INPUT, str(exc))
        raise typer.Exit(exits.BAD_INPUT) from None


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
    mirrored: Annotated[bool, typer.Option("--mirrored", help="Judge the traffic production mirrored to the shadow instead of replaying prompts (docs/mirror.md).")] = False,
    inventory: Inventory = None, json_doc: Json = False, json_events: Events = False,
) -> None:
    """Replay prompts to production and the shadow at temperature 0 and judge the shadow
    (through SSH to a recorded host behind a bastion or bound to its loopback)."""
    if mirrored:
        from ddops.commands.shadow_mirror import compare_mirrored
        return compare_mirrored(production_url, shadow_url, profile, results_dir, inventory,
                                _output(json_doc, json_events))
    from ddops.report.build import write_report
    from ddops.rollout.shadow import tables
    from ddops.rollout.shadow.compare import Settings
    from ddops.rollout.shadow.lifecycle import run_compare

    def body(out: Output) -> int:
        settings = Settings(count=count, concurrency=concurrency, max_tokens=max_tokens)
        out.event("stage", f"replaying {count} prompts to production, then to the shadow")
        run = run_compare(prompts_path=prompts, settings=settings, production_url=production_url,
                          shadow_url=shadow_url, profile_name=profile, results_dir=results_dir,
                          inventory=inventory)
        out.show(tables.prompts_table(run.comparison))
        out.show(tables.totals_table(run.comparison))
        out.show(tables.verdict_table(run.verdict))
        out.event("stage", f"results saved to {run.results_file}")
        report = write_report(run.results_file)
        out.event("stage", f"report: {report}", report_file=str(report))
        passed = run.verdict.passed
        return out.finish(exits.OK if passed else exits.FAILED, {**run.to_dict(), "report_file": str(report)},
                          meaning="verdict passed" if passed else "verdict failed")

    _run(_output(json_doc, json_events), body)




def _connector(inventory: Path | None):
    """host name -> open Remote (a context manager). A host that cannot be reached is
    Unreachable (exit 6), as for deploy: the first contact changes nothing."""
    from ddops.inventory import load_inventory
    from ddops.remote import connect
    hosts = load_inventory(inventory)
    return lambda name: connect(hosts.host(name))


def _progress(out: Output):
    """Deploy-engine progress as events; people see transitions, not every health poll."""
    def report(stage: str, text: str) -> None:
        if out.human and text.startswith(("waiting", "running")):
            return
        out.event("stage", f"{stage}: {text}", stage=stage)
    return report


@shadow_app.command("start")
def shadow_start(
    profile: Annotated[str, typer.Argument(help="Candidate profile (name or YAML path).")],
    host: Host,
    port: Annotated[Optional[int], typer.Option("--port", help="Shadow port (default: the profile's port + 1).")] = None,
    production_host: Annotated[Optional[str], typer.Option("--production-host", help="Where production runs (default: --host).")] = None,
    production_unit: Annotated[Optional[str], typer.Option("--production-unit", help="Production unit (default: the profile's unit).")] = None,
    inventory: Inventory = None, yes: Yes = False, json_doc: Json = False, json_events: Events = False,
    force: Force = False,
    mirror: Annotated[bool, typer.Option("--mirror", help="Then copy production's requests to the shadow (production's profile opts in with service.mirror).")] = False,
    sample: Annotated[float, typer.Option("--sample", help="With --mirror: fraction of mirrored requests the shadow keeps as redacted samples (default 0: none).")] = 0.0,
    dry_run: DryRun = False,
) -> None:
    """Deploy PROFILE as <service>-shadow beside production, gated like a deploy."""
    from ddops.rollout.shadow import lifecycle as shadow

    def body(out: Output) -> int:
        connect = _connector(inventory)
        if dry_run:
            candidate = shadow.prepare(profile, host, port=port, production_host=production_host,
                                       production_unit=production_unit, inventory=inventory, connect=connect,
                                       force=force, mirror=mirror, sample=sample)
            return _dry_run(out, shadow.preview_start(candidate, host, connect, mirror), force)
        _consent(yes, f"Start {profile} as a shadow on {host}?", out)
        done = shadow.start(profile, host, port=port, production_host=production_host,
                            production_unit=production_unit, inventory=inventory,
                            connect=connect, progress=_progress(out), force=force,
                            mirror=mirror, sample=sample)
        return _lifecycle(out, done)

    _run(_output(json_doc, json_events), body)


@shadow_app.command("promote")
def shadow_promote(inventory: Inventory = None, yes: Yes = False, json_doc: Json = False,
                   json_events: Events = False, dry_run: DryRun = False) -> None:
    """Switch production to the shadow's profile (gated, reverted on failure), then remove the shadow."""
    from ddops.rollout.shadow import lifecycle as shadow

    def body(out: Output) -> int:
        connect = _connector(inventory)
        if dry_run:
            return _dry_run(out, shadow.preview_promote(inventory=inventory, connect=connect))
        _consent(yes, "Make the shadow's profile production?", out)
        return _lifecycle(out, shadow.promote(inventory=inventory, connect=connect,
                                              progress=_progress(out)))

    _run(_output(json_doc, json_events), body)


@shadow_app.command("abort")
def shadow_abort(inventory: Inventory = None, yes: Yes = False, json_doc: Json = False,
                 json_events: Events = False, dry_run: DryRun = False) -> None:
    """Remove the shadow; production is not touched."""
    from ddops.rollout.shadow import lifecycle as shadow

    def body(out: Output) -> int:
        connect = _connector(inventory)
        if dry_run:
            return _dry_run(out, shadow.preview_abort())
        _consent(yes, "Remove the shadow?", out)
        return _lifecycle(out, shadow.abort(connect=connect))

    _run(_output(json_doc, json_events), body)


@shadow_app.command("status")
def shadow_status(json_doc: Json = False, json_events: Events = False) -> None:
    """Show the recorded shadow (read-only)."""
    from ddops.rollout.records import load_shadow

    def body(out: Output) -> int:
        record = load_shadow()
        out.event("stage", f"shadow: {record.to_dict() if record else 'none recorded'}")
        if record is not None and not record.started_ok:
            from ddops.rollout.shadow.lifecycle import unfinished
            out.event("stage", unfinished(record))
        return out.finish(exits.OK, {"shadow": record.to_dict() if record else None})

    _run(_output(json_doc, json_events), body)


def _consent(yes: bool, question: str, out: Output) -> None:
    from ddops.rollout.output import consent
    if not consent(yes, question, out):
        raise BadInput("declined at the prompt; nothing changed")


def _dry_run(out: Output, doc: dict, force: bool = False) -> int:
    """Show a dry run's steps; exit 2 when planning refuses (and --force is not given), else 0."""
    for step in doc["steps"]:
        out.event("step", f"{step['action']}: {step['detail']}", **step)
    for refusal in doc["refusals"]:
        out.event("refused", f"{refusal['check']}: {refusal['reason']}", **refusal)
    refused = bool(doc["refusals"]) and not force
    return out.finish(exits.BAD_INPUT if refused else exits.OK, {"dry_run": True, **doc})


def _lifecycle(out: Output, done) -> int:
    _say_result(out, done.code, done.status, done.detail)
    return out.finish(done.code, done.to_dict())


def _say_result(out: Output, code: int, status: str, detail: str) -> None:
    colour = "green" if code == exits.OK else "red"
    out.event("result", f"[{colour}]{status}[/]: {detail}")


def switch_command(
    profile: Annotated[str, typer.Argument(help="Profile to switch to (name or YAML path).")],
    host: Host,
    unit: Annotated[Optional[str], typer.Option("--unit", help="Unit to switch away from (default: the running one).")] = None,
    gpu_timeout: Annotated[float, typer.Option("--gpu-timeout", help="Seconds to wait for the GPU to be free.")] = 60.0,
    results_dir: Annotated[Optional[Path], typer.Option("--results-dir", help="Where to save the JSON result.")] = None,
    inventory: Inventory = None, yes: Yes = False, json_doc: Json = False, json_events: Events = False,
    force: Force = False,
    dry_run: DryRun = False,
) -> None:
    """Switch a single-GPU host to PROFILE: snapshot, stop, check the GPU, start, gate, revert on failure."""
    from ddops.rollout import host_changes
    from ddops.rollout.records import save_result
    from ddops.rollout.switch.single_gpu import plan, switch

    def body(out: Output) -> int:
        target = host_changes.load_target(profile, host, inventory=inventory)
        if dry_run:
            with _connector(inventory)(host) as remote:
                return _dry_run(out, {"host": host, **plan(remote, target, unit, gpu_timeout)}, force)
        _consent(yes, f"Switch {host} to {profile} (the running server stops first)?", out)
        with _connector(inventory)(host) as remote:
            report = switch(remote, target, unit=unit, command=f"ddops switch {profile} --host {host}",
                            gpu_timeout_s=gpu_timeout, progress=_progress(out), force=force)
        doc = report.as_dict()
        doc["results_file"] = str(save_result("switch", doc, results_dir))
        _say_result(out, report.code, report.status, report.detail)
        return out.finish(report.code, doc)

    _run(_output(json_doc, json_events), body)


def rollout_command(
    plan_file: Annotated[Path, typer.Argument(metavar="PLAN.yaml", help="Rollout plan: profile, hosts or selector, canary, wave_size, max_failures, bake_s.")],
    restart: Annotated[bool, typer.Option("--restart", help="Ignore an interrupted rollout of this plan and start over.")] = False,
    approve: Annotated[bool, typer.Option("--approve", help="Continue this plan's paused rollout (needs no --yes).")] = False,
    abort: Annotated[bool, typer.Option("--abort", help="Revert every host this plan's paused rollout changed (needs no --yes).")] = False,
    inventory: Inventory = None, yes: Yes = False, json_doc: Json = False, json_events: Events = False,
    force: Force = False, dry_run: DryRun = False,
) -> None:
    """Roll PROFILE out in waves: canary first, analysis while baking, pauses for approval,
    halt and revert past max failures; resumable."""
    from ddops.rollout.fleet.run_plan import run_plan

    def body(out: Output) -> int:
        return run_plan(plan_file, inventory=inventory, restart=restart, yes=yes, out=out,
                        approve=approve, abort=abort, force=force, dry_run=dry_run)

    _run(_output(json_doc, json_events), body)


def register(app: typer.Typer) -> None:
    app.command("switch")(switch_command)
    app.add_typer(shadow_app, name="shadow")
    app.command("rollout")(rollout_command)
