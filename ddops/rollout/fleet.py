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

from ddops.rollout.waves import (FAILED, REVERT_FAILED, REVERTED, RUNNING, RolloutPlan,
                                 RolloutState)

MAX_WORKERS = 8


@dataclass(frozen=True)
class Outcome:
    """What deploying (or reverting) one host did."""

    status: str  # done, failed, locked, revert_failed (deploy) / reverted, revert_failed (revert)
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
    """Owns the state while the rollout runs; worker threads report through `_set`."""

    def __init__(self, state: RolloutState, store: StateFile, limits: Limits,
                 deploy_one: Callable[[str], Outcome], revert_one: Callable[[str, object], Outcome],
                 on_change: Callable[[RolloutState, str], None] = lambda state, host: None,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.state, self.store, self.limits = state, store, limits
        self.deploy_one, self.revert_one = deploy_one, revert_one
        self.on_change, self.sleep = on_change, sleep
        self._lock = threading.Lock()

    def run(self) -> RolloutState:
        if self.state.status == "reverting":  # interrupted while reverting: finish that first
            return self._halt()
        waves = self.state.pending_waves()
        for number, wave in enumerate(waves):
            self._in_parallel(wave, self._deploy)
            if self.state.must_halt(self.limits.max_failures):
                return self._halt()
            if number < len(waves) - 1 and self.limits.bake_s:
                self.sleep(self.limits.bake_s)  # let the wave serve before widening
        failed = self.state.count(FAILED, "locked", REVERT_FAILED)
        return self._finish("failed" if failed else "succeeded")

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

    def _revert(self, host: str) -> None:
        self._set(host, RUNNING, detail="reverting")
        try:
            outcome = self.revert_one(host, self.state.hosts[host])
        except Exception as exc:
            outcome = Outcome(REVERT_FAILED, detail=f"{type(exc).__name__}: {exc}")
        self._set(host, outcome.status, changed=outcome.status != REVERTED, detail=outcome.detail)

    def _halt(self) -> RolloutState:
        self._finish("reverting")
        hosts = self.state.to_revert()
        self._in_parallel(hosts, self._revert)
        return self._finish("halted")

    def _in_parallel(self, hosts, work: Callable[[str], None]) -> None:
        with ThreadPoolExecutor(max_workers=max(1, min(len(hosts), self.limits.workers))) as pool:
            list(pool.map(work, hosts))

    def _set(self, host: str, status: str, **fields) -> None:
        with self._lock:
            self.state = self.state.with_host(host, status, **fields)
            self.store.save(self.state)
            self.on_change(self.state, host)

    def _finish(self, status: str) -> RolloutState:
        with self._lock:
            self.state = self.state.with_status(status)
            self.store.save(self.state)
            self.on_change(self.state, "")
        return self.state


def resume_or_start(store: StateFile, fresh: RolloutState, restart: bool) -> tuple[RolloutState, bool]:
    """The interrupted state of this plan if there is one (and not `restart`), else `fresh`."""
    old = None if restart else store.load()
    if old is not None and not old.finished and old.plan_digest == fresh.plan_digest:
        return old, True
    return fresh, False


__all__ = ["Limits", "MAX_WORKERS", "Outcome", "Rollout", "StateFile", "resume_or_start"]
