"""`ddops rollout PLAN.yaml`: load and check everything, resume or start, run with a live view."""

from __future__ import annotations

import time
from contextlib import nullcontext
from pathlib import Path

from rich.live import Live

from ddops.rollout import tables
from ddops.rollout.ci import Output, consent
from ddops.rollout.fleet import Rollout, StateFile, resume_or_start
from ddops.rollout.fleet_hosts import deployer, resolve, reverter
from ddops.rollout.records import state_dir
from ddops.rollout.waves import RolloutState, exit_code, load_plan, plan_waves

INTERRUPTED = 130  # like a shell's SIGINT status; the state file resumes the rollout
QUESTION = "Roll {profile} out to {n} host(s) ({waves} wave(s), canary first)?"


def run_plan(plan_file: Path, *, inventory: Path | None, restart: bool, yes: bool,
             out: Output) -> int:
    plan = load_plan(plan_file)
    out.event("stage", f"loading {plan.source}: profile {plan.profile}")
    fleet = resolve(plan, inventory)
    waves = plan_waves(fleet.hosts, fleet.canary, fleet.wave_size)
    store = StateFile.for_plan(state_dir(), plan)
    state, resumed = resume_or_start(store, RolloutState.start(plan, waves, fleet.canary), restart)
    if resumed:
        out.event("stage", f"resuming the interrupted rollout in {store.path}")
    out.show(tables.hosts_table(state, "Plan"))
    if not consent(yes, QUESTION.format(profile=plan.profile, n=len(fleet.hosts), waves=len(waves)), out):
        return out.fail(2, "declined at the prompt; nothing changed")
    command = f"ddops rollout {plan_file}"
    started = time.monotonic()
    with _live(out, state) as view:
        def on_change(current: RolloutState, host: str) -> None:
            if host:
                h = current.hosts[host]
                out.event("host", "", host=host, status=h.status, detail=h.detail)
            if view is not None:
                view.update(tables.hosts_table(current))
        rollout = Rollout(state, store, fleet.limits, deployer(fleet, command),
                          reverter(fleet, command), on_change=on_change)
        try:
            final = rollout.run()
        except KeyboardInterrupt:  # hosts in flight finished first; their outcome is recorded
            out.show("")
            return out.finish(INTERRUPTED, {**rollout.state.to_dict(), "resumed": resumed,
                                            "state_file": str(store.path), "error":
                                            "interrupted: run the same command again to resume"})
    out.show("")
    wall = time.monotonic() - started
    out.event("stage", f"rollout {final.status} in {wall:.1f} s; state in {store.path}")
    return out.finish(exit_code(final), {**final.to_dict(), "resumed": resumed,
                                         "state_file": str(store.path), "wall_s": round(wall, 2)})


def _live(out: Output, state: RolloutState):
    if not out.human:
        return nullcontext(None)
    return Live(tables.hosts_table(state), console=out.console, refresh_per_second=4, transient=False)
