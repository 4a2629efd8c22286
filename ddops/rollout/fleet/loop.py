"""Run a fleet rollout: canary, then waves in parallel, halt and revert past max failures.

Hosts are deployed through callables (`deploy_one`, `revert_one`) that the command wires to the
deploy engine, so this loop is the same for the real fleet and for the fast unit test. Every
transition is written to the state file before the next step, so an interrupted rollout resumes.
"""

from __future__ import annotations

import json
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ddops.rollout.fleet.waves import (DONE, FAILED, NOT_DONE, PENDING, REVERT_FAILED, REVERTED, RUNNING,
                                 RolloutPlan, RolloutState)

MAX_WORKERS = 8


@dataclass(frozen=True)
class Outcome:
    """What deploying (or reverting) one host did."""

    status: str  # done, failed, locked, unreachable, revert-failed (deploy) / reverted, revert-failed (revert)
    changed: bool = False
    detail: str = ""
    before: str | None = None  # the host's version before the deploy (for a later revert)


@dataclass(frozen=True)
class Limits:
    max_failures: int
    bake_s: float
    workers: int


class StateFile:
    """The rollout's state on this machine; written atomically after each transition."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    @classmethod
    def for_plan(cls, state_dir: Path, plan: RolloutPlan) -> "StateFile":
        return cls(Path(state_dir) / "rollouts" / f"{Path(plan.source).stem}-{plan.digest}.json")

    def load(self) -> RolloutState | None:
        if not self.path.exists():
            return None
        return RolloutState.from_dict(json.loads(self.path.read_text()))

    def save(self, state: RolloutState) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(state.to_dict(), indent=2))
        os.replace(tmp, self.path)


class Rollout:
    """Owns the state while the rollout runs; worker threads report through `_set`.

    `watcher` (ddops.rollout.fleet.bake.Watcher) judges each wave's changed hosts while it bakes;
    without one, baking is a sleep between waves. `pause_after` holds wave indexes after
    which the rollout stops as `paused` until approved. `on_event(kind, fields)` hears
    wave, analysis, pause, halt, revert and finish, in order (notifications)."""

    def __init__(self, state: RolloutState, store: StateFile, limits: Limits,
                 deploy_one: Callable[[str], Outcome], revert_one: Callable[[str, object], Outcome],
                 on_change: Callable[[RolloutState, str], None] = lambda state, host: None,
                 sleep: Callable[[float], None] = time.sleep, watcher=None,
                 pause_after: tuple[int, ...] = (),
                 on_event: Callable[[str, dict], None] = lambda kind, fields: None) -> None:
        self.state, self.store, self.limits = state, store, limits
        self.deploy_one, self.revert_one = deploy_one, revert_one
        self.on_change, self.sleep = on_change, sleep
        self.watcher, self.pause_after, self._notify = watcher, pause_after, on_event
        self._lock = threading.Lock()

    def on_event(self, kind: str, fields: dict) -> None:
        """Kept in the state's timeline (verdicts live under `analysis`), then passed on."""
        entry = {"time": round(time.time(), 3), "event": kind,
                 **{k: v for k, v in fields.items() if k != "verdicts"}}
        if "verdicts" in fields:
            entry["passed"] = {h: v["passed"] for h, v in fields["verdicts"].items()}
        with self._lock:
            self.state = self.state.logged(entry)
            self.store.save(self.state)
        self._notify(kind, fields)

    def run(self) -> RolloutState:
        if self.state.status == "reverting":  # interrupted while reverting: finish that first
            return self._halt("interrupted while reverting")
        for index, wave in enumerate(self.state.waves):
            todo = [h for h in wave if self.state.hosts[h].status in (PENDING, RUNNING)]
            if todo:
                self.on_event("wave", {"wave": index, "hosts": todo})
                self._in_parallel(todo, self._deploy)
                self._bake(index, todo)
                self.on_event("wave_done", {"wave": index, "hosts": {
                    h: self.state.hosts[h].status for h in todo}})
                if self.state.must_halt(self.limits.max_failures):
                    return self._halt(f"more than {self.limits.max_failures} failed host(s)")
            if index in self.pause_after and index not in self.state.approved:
                return self._pause(index)
        failed = self.state.count(*NOT_DONE)
        return self._finish("failed" if failed else "succeeded")

    def approve(self) -> None:
        """Operator's yes at a pause: `run` then continues after the paused wave."""
        self.on_event("approve", {"wave": self.state.paused_at})
        with self._lock:
            self.state = self.state.approve()
            self.store.save(self.state)

    def abort(self) -> RolloutState:
        """Operator's no at a pause: revert every host this rollout changed."""
        return self._halt("aborted by the operator", final="aborted")

    def _bake(self, index: int, wave: list[str]) -> None:
        last = index == len(self.state.waves) - 1
        if self.watcher is None:
            if not last and self.limits.bake_s and not self.state.must_halt(self.limits.max_failures):
                self.sleep(self.limits.bake_s)  # let the wave serve before widening
            return
        changed = [h for h in wave if self.state.hosts[h].status == DONE and self.state.hosts[h].changed]
        if not changed or self.state.must_halt(self.limits.max_failures):
            return
        later = [h for w in self.state.waves[index + 1:] for h in w
                 if self.state.hosts[h].status == PENDING]
        verdicts = self.watcher.bake(changed, later)
        self.on_event("analysis", {"wave": index, "verdicts": verdicts})
        failed = [h for h, v in verdicts.items() if not v["passed"]]
        self._in_parallel(failed, lambda h: self._revert(h, failed_by="; ".join(verdicts[h]["reasons"])))

    def record(self, host: str, kind: str, data: dict) -> None:
        """An analysis baseline, sample or verdict, saved with the state (Watcher's sink)."""
        with self._lock:
            self.state = self.state.with_analysis(host, kind, data)
            self.store.save(self.state)

    def _deploy(self, host: str) -> None:
        self._set(host, RUNNING, detail="deploying")
        try:
            outcome = self.deploy_one(host)
        except Exception as exc:  # one host's surprise must not take the other threads down
            outcome = Outcome(FAILED, detail=f"{type(exc).__name__}: {exc}")
        # A host interrupted earlier may show no change now although this rollout changed it.
        changed = outcome.changed or self.state.hosts[host].changed
        self._set(host, outcome.status, changed=changed, detail=outcome.detail,
                  before=outcome.before)

    def _revert(self, host: str, failed_by: str = "") -> None:
        """Put a host back; one that failed its analysis then counts as failed, like a host
        whose gate failed (the deploy engine reverts those itself)."""
        self._set(host, RUNNING, detail="reverting")
        try:
            outcome = self.revert_one(host, self.state.hosts[host])
        except Exception as exc:
            outcome = Outcome(REVERT_FAILED, detail=f"{type(exc).__name__}: {exc}")
        status = FAILED if failed_by and outcome.status == REVERTED else outcome.status
        detail = f"analysis failed: {failed_by}; {outcome.detail}" if failed_by else outcome.detail
        self._set(host, status, changed=outcome.status != REVERTED, detail=detail)
        self.on_event("revert", {"host": host, "status": outcome.status, "detail": outcome.detail})

    def _halt(self, reason: str, final: str = "halted") -> RolloutState:
        """Revert every host this rollout changed. While a revert has failed the rollout stays
        `reverting`, unfinished: the same command run again resumes it and tries the revert again
        (`ddops status` names it meanwhile), rather than starting afresh past a changed host."""
        self.on_event("halt" if final == "halted" else "abort", {"reason": reason})
        self._finish("reverting", notify=False)
        hosts = self.state.to_revert()
        self._in_parallel(hosts, self._revert)
        failed = [h for h in hosts if self.state.hosts[h].status == REVERT_FAILED]
        if failed:      # (a host whose own deploy failed mid-way is not one: its rerun recovers it)
            self.on_event("unreverted", {"hosts": failed})
            return self.state
        return self._finish(final)

    def _pause(self, index: int) -> RolloutState:
        with self._lock:
            self.state = self.state.paused(index)
            self.store.save(self.state)
            self.on_change(self.state, "")
        self.on_event("pause", {"wave": index})
        return self.state

    def _in_parallel(self, hosts, work: Callable[[str], None]) -> None:
        if not hosts:
            return
        with ThreadPoolExecutor(max_workers=max(1, min(len(hosts), self.limits.workers))) as pool:
            list(pool.map(work, hosts))

    def _set(self, host: str, status: str, **fields) -> None:
        with self._lock:
            self.state = self.state.with_host(host, status, **fields).logged(
                {"time": round(time.time(), 3), "host": host, "status": status,
                 "detail": fields.get("detail", "")})
            self.store.save(self.state)
            self.on_change(self.state, host)

    def _finish(self, status: str, notify: bool = True) -> RolloutState:
        with self._lock:
            self.state = self.state.with_status(status)
            self.store.save(self.state)
            self.on_change(self.state, "")
        if notify:
            self.on_event("finish", {"status": status})
        return self.state


def resume_or_start(store: StateFile, fresh: RolloutState, restart: bool) -> tuple[RolloutState, bool]:
    """The interrupted state of this plan if there is one (and not `restart`), else `fresh`."""
    old = None if restart else store.load()
    if old is not None and not old.finished and old.plan_digest == fresh.plan_digest:
        return old, True
    return fresh, False


__all__ = ["Limits", "MAX_WORKERS", "Outcome", "Rollout", "StateFile", "resume_or_start"]
