"""`ddops rollout PLAN.yaml`: load and check everything, resume or start, run with a live view.

A paused rollout (after a `pause_after` wave) waits in its state file: the same command with
`--approve` continues it, with `--abort` reverts every host it changed; without either it
says it is still paused (exit 5) and changes nothing.
"""

from __future__ import annotations

import time
from contextlib import ExitStack, nullcontext
from dataclasses import replace
from pathlib import Path

from rich.live import Live

from ddops import exits
from ddops.exits import BadInput

from ddops.rollout import host_changes
from ddops.rollout.fleet import tables
from ddops.rollout.fleet.bake import Watcher
from ddops.rollout.fleet.hosts import Endpoints, deployer, plan_hosts, resolve, reverter
from ddops.rollout.fleet.loop import Rollout, StateFile, resume_or_start
from ddops.rollout.fleet.notify import Notifier, text_of
from ddops.rollout.fleet.waves import (PAUSED, RolloutState, exit_code, load_plan, pause_waves,
                                 plan_waves)
from ddops.rollout.output import Output, consent
from ddops.rollout.records import state_dir

INTERRUPTED = 130  # like a shell's SIGINT status; the state file resumes the rollout
QUESTION = "Roll {profile} out to {n} host(s) ({waves} wave(s), canary first)?"


def run_plan(plan_file: Path, *, inventory: Path | None, restart: bool, yes: bool, out: Output,
             approve: bool = False, abort: bool = False, force: bool = False, dry_run: bool = False) -> int:
    """force: hosts whose planning refuses the change get it anyway (each history entry records
    what was overridden); reverts are never forced. dry_run: each host's plan, in wave order."""
    if approve and abort or (approve or abort) and restart:
        raise BadInput("--approve, --abort and --restart: choose one")
    plan = load_plan(plan_file)
    out.event("stage", f"loading {plan.source}: profile {plan.profile}")
    fleet = resolve(plan, inventory)
    waves = plan_waves(fleet.hosts, fleet.canary, fleet.wave_size)
    if dry_run:
        return _dry_run(fleet, waves, out, force)
    pauses = pause_waves(fleet.pause_points, waves, fleet.canary, plan.source)
    store = StateFile.for_plan(state_dir(), plan)
    state, resumed = resume_or_start(store, RolloutState.start(plan, waves, fleet.canary), restart)
    if (approve or abort) and state.status != PAUSED:
        raise BadInput(f"--{'approve' if approve else 'abort'}: no paused rollout of this plan "
                       f"(state file {store.path})")
    if resumed:
        out.event("stage", f"resuming the {state.status} rollout in {store.path}")
    out.show(tables.hosts_table(state, "Plan"))
    if state.status == PAUSED and not (approve or abort):
        return _result(out, state, resumed, store, 0.0, [])
    if not (approve or abort or resumed) and fleet.analysis and fleet.analysis.mirror:
        from ddops.rollout.shadow.lifecycle import require_mirrored   # before the canary (docs/mirror.md)
        refused = require_mirrored(fleet.analysis.mirror, inventory, out)
        if refused is not None:
            return refused
    if not (approve or abort) and not consent(yes, QUESTION.format(
            profile=plan.profile, n=len(fleet.hosts), waves=len(waves)), out):
        return out.fail(2, "declined at the prompt; nothing changed")
    notifier = Notifier(list(fleet.webhooks))
    emit = _emitter(out, notifier, plan)
    started = time.monotonic()
    command = f"ddops rollout {plan_file}" + (" --force" if force else "")
    state = replace(state, runner=host_changes.Holder.here(command).as_dict())   # who runs it now (status)
    with _live(out, state) as view, ExitStack() as tunnels:
        rollout = _rollout(fleet, state, store, pauses, out, view, emit, command, force, tunnels)
        if approve:
            rollout.approve()
        elif not resumed:
            checks = analysis_checks(fleet.analysis)
            rollout.on_event("start", {"hosts": list(fleet.hosts), "waves": [list(w) for w in waves],
                                       "checks": checks, "forced": force})
        try:
            final = rollout.abort() if abort else rollout.run()
        except KeyboardInterrupt:  # hosts in flight finished first; their outcome is recorded
            out.show("")
            return out.finish(INTERRUPTED, {**rollout.state.to_dict(), "resumed": resumed,
                                            "state_file": str(store.path), "notifications": notifier.close(),
                                            "error": "interrupted: run the same command again to resume"})
    out.show("")
    wall = time.monotonic() - started
    out.event("stage", f"rollout {final.status} in {wall:.1f} s; state in {store.path}")
    return _result(out, final, resumed, store, wall, notifier.close())


def analysis_checks(analysis) -> list[dict]:
    """What the rollout will judge, for its start event: the checks, then the PromQL queries."""
    if analysis is None:
        return []
    queries = analysis.prometheus.queries if analysis.prometheus else []
    return [c.model_dump() for c in analysis.checks] + [{"promql": q.model_dump()} for q in queries]


def _dry_run(fleet, waves, out: Output, force: bool) -> int:
    """Every host's deploy plan against what it holds now, in wave order; nothing changes. Exit 2
    when planning refuses any host (a rollout would stop there), unless forced."""
    hosts = plan_hosts(fleet, waves)
    for host, shown in hosts.items():
        why = "; ".join(f"{r['check']}: {r['reason']}" for r in shown["refusals"])
        out.event("host", f"{host}: {', '.join(s['action'] for s in shown['steps']) or 'no change'}"
                          + (f"; refused: {why}" if why else ""), host=host, **shown)
    refused = any(h["refusals"] for h in hosts.values()) and not force
    return out.finish(exits.BAD_INPUT if refused else exits.OK,
                      {"dry_run": True, "waves": [list(w) for w in waves], "hosts": hosts})


def _rollout(fleet, state, store, pauses, out, view, emit, command, force: bool, tunnels: ExitStack) -> Rollout:
    def on_change(current: RolloutState, host: str) -> None:
        if host:
            h = current.hosts[host]
            out.event("host", "", host=host, status=h.status, detail=h.detail)
        if view is not None:
            view.update(tables.hosts_table(current))

    rollout = None
    watcher = None
    if fleet.analysis is not None:
        watcher = Watcher(fleet.analysis, fleet.limits.bake_s, Endpoints(fleet, tunnels),
                          lambda host, kind, data: rollout.record(host, kind, data))
    deploy_one = deployer(fleet, command, force)
    if watcher is not None:  # `unchanged` falls back to it when no host is left unchanged
        def deploy_one(host, deploy=deploy_one):  # noqa: F811 - the same deploy, after a baseline
            watcher.capture_before(host)
            return deploy(host)
    rollout = Rollout(state, store, fleet.limits, deploy_one, reverter(fleet, command),
                      on_change=on_change, watcher=watcher, pause_after=pauses,
                      on_event=emit)
    return rollout


def _emitter(out: Output, notifier: Notifier, plan):
    def emit(kind: str, fields: dict) -> None:
        event = {"event": kind, "time": round(time.time(), 3), "profile": plan.profile,
                 "plan": plan.source, **fields}
        notifier.send(event)
        out.event(kind, text_of(event), **fields)
    return emit


def _result(out: Output, state: RolloutState, resumed: bool, store: StateFile, wall: float,
            notifications: list) -> int:
    doc = {**state.to_dict(), "resumed": resumed, "state_file": str(store.path),
           "wall_s": round(wall, 2), "notifications": notifications}
    if state.status == PAUSED:
        out.event("stage", f"paused after wave {state.paused_at}: run again with --approve to "
                  "continue or --abort to revert")
    meaning = "paused: waiting for --approve or --abort" if state.status == PAUSED else \
        "aborted and reverted" if state.status == "aborted" else None
    return out.finish(exit_code(state), doc, meaning=meaning)


def _live(out: Output, state: RolloutState):
    if not out.human:
        return nullcontext(None)
    return Live(tables.hosts_table(state), console=out.console, refresh_per_second=4, transient=False)


def interrupted_rollouts(host: str) -> list[dict]:
    """Rollouts of this machine over `host` whose process died mid-way (their state file says
    running or reverting), in `ddops status`'s words for what a dead holder left."""
    left = []
    for path in sorted((state_dir() / "rollouts").glob("*.json")):
        try:
            state = StateFile(path).load()
        except (ValueError, KeyError, TypeError):
            continue          # not a rollout's state: the rollout itself says so when run
        if state is None or state.finished or state.status == PAUSED or host not in state.hosts \
                or not host_changes.gone(state.runner):
            continue
        by = state.runner
        changed = [h for h, s in state.hosts.items() if s.changed]
        left.append({"what": by.get("command"), "stage": f"rollout {state.status}", "holder": by,
                     "since": by.get("since"), "production": [], "changed": changed,
                     "next": f"{by.get('command')} (resumes it)"})
    return left
