"""`ddops tune PROFILE --host H`: search the profile's settings on the host beside production.

Plan first (every candidate checked, the skipped ones named, the time guessed), then each
candidate runs as `<unit>-tune` under the host's tune lease, gated like a deploy, loaded at each
concurrency and compared with production in the same run; the winner is written as
`<profile>-tuned.yaml` and, with --apply, deployed through the normal gate (docs/tune.md).
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.table import Table

from ddops import exits
from ddops.exits import BadInput
from ddops.commands.rollout import (DryRun, Events, Host, Inventory, Json, Yes, _connector, _consent,
                                    _output, _progress, _run)
from ddops.rollout.output import Output


def register(app: typer.Typer) -> None:
    app.command("tune")(tune)


def parse_levels(text: str) -> tuple[int, ...]:
    try:
        levels = tuple(int(x) for x in text.split(","))
    except ValueError:
        raise BadInput(f"--concurrency: a comma-separated list of request counts, got {text!r}") from None
    if not levels or any(not 1 <= c <= 32 for c in levels):
        raise BadInput(f"--concurrency: each level must be 1..32, got {text!r}")
    return tuple(sorted(set(levels)))


def parse_budget(text: str, option: str = "--budget") -> float:
    """`30m`, `90s`, `1h`, or seconds."""
    found = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smh]?)\s*", text)
    if not found or float(found[1]) <= 0:
        raise BadInput(f"{option}: a time such as 30m, 90s or 1h, got {text!r}")
    return float(found[1]) * {"": 1, "s": 1, "m": 60, "h": 3600}[found[2]]


def tune(
    profile: Annotated[str, typer.Argument(help="Base profile (name or YAML path); candidates extend it.")],
    host: Host,
    on: Annotated[Optional[str], typer.Option("--on", help="Run the candidates on this spare host of the inventory; production's host only serves the yardstick.")] = None,
    space: Annotated[Optional[Path], typer.Option("--space", help="YAML of profile key -> values, narrowing or extending the runtime's tunable keys.")] = None,
    prompts: Annotated[Optional[Path], typer.Option("--prompts", help="Prompt file (default: the shipped set).")] = None,
    mirrored: Annotated[bool, typer.Option("--mirrored", help="Load each candidate with production's own requests, copied by its tap (a bundled production with service.mirror), instead of a prompt file.")] = False,
    mirror_wait: Annotated[str, typer.Option("--mirror-wait", help="With --mirrored: how long each candidate waits for --count requests (5m, 300s).")] = "5m",
    count: Annotated[int, typer.Option("--count", help="Requests per concurrency level (with --mirrored: mirrored requests per candidate).")] = 8,
    max_tokens: Annotated[int, typer.Option("--max-tokens", help="Tokens generated per request.")] = 32,
    concurrency: Annotated[Optional[str], typer.Option("--concurrency", help="Levels measured, e.g. 1,4 (default 1,4; not with --mirrored: the traffic's own).")] = None,
    objective: Annotated[str, typer.Option("--objective", help="throughput (tok/s) or latency (ITL p50).")] = "throughput",
    slo: Annotated[Optional[str], typer.Option("--slo", help="Bounds every level must meet, e.g. ttft_p99_ms=800,itl_p99_ms=60.")] = None,
    budget: Annotated[str, typer.Option("--budget", help="Stop starting candidates after this long (30m, 600s).")] = "30m",
    search: Annotated[str, typer.Option("--search", help="grid, model (Optuna TPE) or auto (grid up to 8 candidates).")] = "auto",
    trials: Annotated[Optional[int], typer.Option("--trials", help="Candidates measured at most (default: all of a grid; a third of a larger space).")] = None,
    port: Annotated[Optional[int], typer.Option("--port", help="The candidates' port (default: the profile's port + 2).")] = None,
    production_unit: Annotated[Optional[str], typer.Option("--production-unit", help="Production's unit (default: the profile's).")] = None,
    out_file: Annotated[Optional[Path], typer.Option("--out", help="Where to write the tuned profile (default: <profile>-tuned.yaml beside it).")] = None,
    apply: Annotated[bool, typer.Option("--apply", help="Deploy the tuned profile as production (gated, reverted on failure).")] = False,
    inventory: Inventory = None, yes: Yes = False, json_doc: Json = False, json_events: Events = False,
    dry_run: DryRun = False,
) -> None:
    """Find the best settings of PROFILE on HOST, measured beside production, which keeps serving."""
    from ddops.tune import plan as plans
    from ddops.tune.measure import Requirements, parse_slo

    def body(out: Output) -> int:
        if objective not in ("throughput", "latency"):
            raise BadInput(f"--objective: throughput or latency, got {objective!r}")
        if search not in ("auto", "grid", "model"):
            raise BadInput(f"--search: auto, grid or model, got {search!r}")
        if trials is not None and trials < 1:
            raise BadInput(f"--trials: at least 1, got {trials}")
        budget_s, bounds = parse_budget(budget), parse_slo(slo)
        load = load_of(prompts, mirrored, mirror_wait, count, max_tokens, concurrency)
        from ddops.profile import load_profile
        base = load_profile(profile)
        requirements = Requirements(base.rollout.min_token_equality, **bounds)
        connect = _connector(inventory)
        out.event("stage", f"planning: every candidate of {base.name}'s space checked on {host}")
        plan = plans.plan(profile, host, space_file=space, load=load, objective=objective,
                          requirements=requirements, search=search, trials=trials, budget_s=budget_s,
                          port=port, production_unit=production_unit, inventory=inventory, connect=connect,
                          spare=on)
        from ddops.tune import study
        plan.pace, plan.measured_before = study.pace_on(plan), study.measured_count(plan)   # from earlier runs
        _show_plan(out, plan)
        if not plan.runnable:
            return out.fail(exits.BAD_INPUT, f"all {len(plan.candidates)} candidates were refused before "
                            "starting; nothing was started", "see each candidate's reason (`skipped`)",
                            **plan.to_dict())
        if dry_run:
            return out.finish(exits.OK, {"dry_run": True, **plan.to_dict()})
        where = f"on {on} (production on {host})" if on else f"beside production on {host}"
        _consent(yes, f"Start up to {plan.trials} candidates of {base.name} {where}?", out)
        return _tune(out, plan, connect, inventory, apply, out_file)

    _run(_output(json_doc, json_events), body)


def load_of(prompts: Path | None, mirrored: bool, mirror_wait: str, count: int, max_tokens: int,
            concurrency: str | None):
    """What each candidate is loaded with: the prompt file at each concurrency level, or
    production's own requests, mirrored."""
    from ddops.rollout.shadow.compare import SettingsError, chosen_prompts
    from ddops.rollout.shadow.prompts import load_prompts
    from ddops.tune.measure import MIRRORED, Load
    if not 1 <= count <= 1000 or not 1 <= max_tokens <= 4096:
        raise SettingsError("--count must be 1..1000 and --max-tokens 1..4096")
    if mirrored and (prompts or concurrency):
        raise BadInput("--mirrored loads the candidates with production's own requests, at their own "
                       "concurrency: leave out --prompts and --concurrency")
    if mirrored:
        return Load((), (MIRRORED,), max_tokens, mirrored=True, count=count,
                    wait_s=parse_budget(mirror_wait, "--mirror-wait"))
    return Load(tuple(chosen_prompts(load_prompts(prompts), count)), parse_levels(concurrency or "1,4"), max_tokens)


def _show_plan(out: Output, plan) -> None:
    table = Table(title=f"tune plan: {plan.base.name} on {plan.runs_on} ({plan.search}, study {plan.study})")
    for name in ("candidate", "plan"):
        table.add_column(name)
    for c in plan.candidates:
        table.add_row(c.label, f"[red]skipped[/]: {c.skipped}" if c.skipped else "run")
    out.show(table)
    resumed = f", {plan.measured_before} measured by an earlier run" if plan.measured_before else ""
    out.event("plan", f"{len(plan.runnable)} of {len(plan.candidates)} candidates can run "
                      f"({len(plan.candidates) - len(plan.runnable)} skipped before starting); up to {plan.trials} "
                      f"measured{resumed} as {plan.unit} on {plan.runs_on}:{plan.port}, about "
                      f"{_minutes(plan.estimate_s())} ({plan.pace.basis}; budget {plan.budget_s / 60:.0f} min); "
                      f"production {plan.production_unit} on {plan.host} keeps serving",
              runnable=len(plan.runnable), skipped=len(plan.candidates) - len(plan.runnable),
              trials=plan.trials, estimate_s=round(plan.estimate_s()), estimate_basis=plan.pace.basis)


def _minutes(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min"


def _tune(out: Output, plan, connect, inventory, apply: bool, out_file) -> int:
    from ddops.report.build import write_report
    from ddops.tune import result, study
    began = time.monotonic()
    ran = study.run(plan, connect, _progress(out))
    if ran.reference.failed:
        return out.fail(exits.FAILED, f"{ran.reference.failed}; no candidate was started",
                        "production is untouched; `ddops diagnose` on the candidates' host reads why",
                        tune=plan.to_dict(), wall_s=round(time.monotonic() - began, 1))
    for note in ran.notes:
        out.event("recovered", note)
    if ran.measured_before:
        out.event("stage", f"resumed study {plan.study}: {ran.measured_before} candidate(s) measured by an earlier run")
    found = result.rows(plan, ran.study)
    chosen = result.winner(found)
    tuned = result.write_tuned(plan, chosen, ran.reference, out_file) if chosen else None
    doc = result.document(plan, found, ran, tuned, time.monotonic() - began)
    saved = result.save(plan, doc)
    page = write_report(saved)
    out.show(_rows_table(found))
    out.event("stage", f"result {saved}; page {page}", results_file=str(saved), report_file=str(page))
    doc.update(results_file=str(saved), report_file=str(page))
    if chosen is None:
        return out.finish(exits.FAILED, doc, meaning="no candidate met the requirements")
    out.event("result", f"[green]chosen[/]: {chosen.label}, {chosen.objective:.2f}x production; "
                        f"written to {tuned}")
    if not apply:
        return out.finish(exits.OK, doc)
    return _apply(out, plan, tuned, connect, inventory, doc)


def _apply(out: Output, plan, tuned: Path, connect, inventory, doc: dict) -> int:
    """The tuned profile through the normal deploy: lock, push, restart, gate, revert."""
    from ddops.rollout import host_changes
    target = host_changes.load_target(str(tuned), plan.host, inventory=inventory, unit_name=plan.production_unit)
    with connect(plan.host) as remote:
        done = host_changes.deploy(remote, target, f"ddops tune {plan.base.name} --apply", _progress(out))
    doc["applied"] = done.as_dict()
    out.event("result", f"apply: {done.result}: {done.message}")
    return out.finish(done.code, doc)


def _rows_table(found) -> Table:
    table = Table(title="candidates (x production: geometric mean over the levels)")
    for name in ("candidate", "status", "x production", "tok/s by level", "ITL p50 ms by level", "accept", "why"):
        table.add_column(name)
    for r in found:
        tps = " / ".join(f"{lv['tokens_per_s']:.1f}" if lv.get("tokens_per_s") else "-" for lv in r.levels)
        itl = " / ".join(f"{lv['itl_p50_s'] * 1000:.0f}" if lv.get("itl_p50_s") else "-" for lv in r.levels)
        table.add_row(r.label, r.status, f"{r.objective:.2f}" if r.objective else "-", tps, itl,
                      f"{r.accept_length:.2f}" if r.accept_length else "-", r.reason or "")
    return table
