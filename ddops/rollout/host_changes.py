"""What rollouts do to one host: the only rollout module that imports the deploy engine
(ddops.deploy); switch, shadow and fleet reach it through here (tests/test_map.py checks).

deploy    load_target + execute (lock, push, restart, gate, revert on failure);
rollback  re-apply a history entry through execute (gated like any deploy);
holding   the host lock for a whole change (deploy/change.py: settles what a dead holder left);
change    the record a change that spans units writes first (begin, advance, end, was);
stop / start / remove  a unit under the host's lock, for switch and shadow;
snapshot  what a unit runs now (files header, history entry, /server_info) before a change;
reads     the engine's day-2 reads a rollout needs (units_on, pick_unit, unit_state, unit_status,
          api_key_of, unit_argv, dialable; a lock holder: Holder, gone, describe), re-exported.
"""

from __future__ import annotations

import shlex
import time
from dataclasses import dataclass

from ddops import exits
from ddops.deploy import Holder, LockHeld, RecoveryFailed, execute, load_target
from ddops.deploy.lock import describe, gone
from ddops.deploy import change, history, ops
from ddops.deploy.ops import pick_unit, unit_status, units_on
from ddops.deploy import rollback as rollbacks
from ddops import systemd
from ddops.deploy.adopt import content_hash
from ddops.deploy.desired import api_key_of, env_file_of, health_spec, unit_argv
from ddops.deploy.facts import deploy_dir, unit_state
from ddops.deploy.tunnel import dialable
from ddops.deploy.gate import GateSpec
from ddops.deploy.recover import unit_paths
from ddops.render import read_header

q = shlex.quote
NO_UNIT = "none"  # `before` of a host that had no such unit: reverting removes it


@dataclass(frozen=True)
class Result:
    """One host operation; `code` follows the exit-code contract."""

    host: str
    code: int
    result: str  # deployed, unchanged, reverted, revert-failed, locked, failed, unreachable, ...
    message: str
    entry: str | None = None

    def as_dict(self) -> dict:
        return {"host": self.host, "exit_code": self.code, "result": self.result,
                "message": self.message, "history_entry": self.entry}


def holding(remote, command: str, progress=lambda stage, text: None):
    """The host's lock for a whole change; raises LockHeld (exit 4)."""
    return change.holding(remote, Holder.here(command), progress)


def deploy(remote, target, command: str, progress=lambda stage, text: None, force: bool = False) -> Result:
    """execute() with its exceptions turned into exit codes; a knowably bad target is refused
    (exit 2, result `refused`) before the host changes unless forced."""
    name = remote.host.name
    try:
        outcome = execute(remote, target.desired, target.spec, Holder.here(command), progress,
                          profile=target.profile, force=force)
    except LockHeld as err:
        return Result(name, exits.LOCKED, "locked", str(err))
    except RecoveryFailed as err:
        return Result(name, exits.NEEDS_OPERATOR, "revert-failed", str(err))
    return Result(name, outcome.code, outcome.result, outcome.message, outcome.entry)


def plan_of(remote, target):
    """The deploy engine's plan of target against the host as it is now (with its refusals)."""
    from ddops.deploy.apply import plan_now
    return plan_now(remote, target.desired, target.profile)


def refusals(remote, target) -> list:
    """The planning checks for target on this host, for callers that must change the host
    before they deploy (switch stops the running unit first)."""
    from ddops.deploy.refusals import refusals
    return refusals(remote, target.desired.unit_text, target.profile, target.desired.unit_name)


def version_before(remote, unit: str) -> str | None:
    """The history entry the unit runs now, NO_UNIT when absent, None when ddops cannot tell.
    A hand-written unit is known by its files' content hash once adopted (`ddops adopt`). A unit
    whose deploy was cut short runs what its recovery puts back (a resumed rollout's canary)."""
    text = ops.settled_unit(remote, unit)
    if text is None:
        return NO_UNIT
    return _entry_running(remote, unit, text, lambda: remote.read_text(env_file_of(text) or unit_paths(unit)[1]))


def _entry_running(remote, unit: str, text: str, env_text) -> str | None:
    """env_text() is read only for a unit without a ddops header (an adopted one)."""
    current = read_header(text).get("hash")
    if current is None:
        current = content_hash(text, env_text() or "")
    for entry in reversed(history.entries(remote, unit)):
        if entry.record.hash == current and entry.record.result in ops.GOOD:
            return entry.id
    return None


def rollback(remote, unit: str, entry_id: str, command: str, progress=lambda s, t: None) -> Result:
    """Put the unit back to a history entry, gated like a deploy."""
    try:
        outcome = rollbacks.find(remote, unit, entry_id).apply(remote, Holder.here(command), progress)
    except LockHeld as err:
        return Result(remote.host.name, exits.LOCKED, "locked", str(err))
    except (RecoveryFailed, ops.OpsError, FileNotFoundError) as err:
        return Result(remote.host.name, exits.NEEDS_OPERATOR, "revert-failed", str(err))
    return Result(remote.host.name, outcome.code, outcome.result, outcome.message, outcome.entry)


def begin_change(remote, command: str, production: list[str], desired) -> "change.Change":
    """Record, before the first step, a change that stops the `production` units to deploy
    `desired` (plan.Desired): how to finish it and how to undo it (deploy/change.py)."""
    was = tuple(change.was(remote, unit) for unit in production)
    off = tuple(unit for unit in production if unit != desired.unit_name)
    return change.begin(remote, change.Change(command, Holder.here(command).as_dict(), time.time(), was,
                                              desired.unit_name, desired.profile_hash, off))


def remove_unit(remote, unit: str, command: str) -> Result:
    """Stop, disable and delete a unit and its env file (history is kept for the audit trail).
    An unfinished deploy of that unit (a shadow start killed midway) goes with it: its backup
    would only bring back the unit this removes."""
    unit_path, env_path = unit_paths(unit)
    try:
        with holding(remote, command):
            remote.run(f"{systemd.remove(unit, unit_path, env_path)}; rm -rf {shlex.quote(deploy_dir(unit))}")
            state = unit_state(remote, unit)
    except LockHeld as err:
        return Result(remote.host.name, exits.LOCKED, "locked", str(err))
    if state.active in ("active", "activating", "deactivating"):
        return Result(remote.host.name, exits.NEEDS_OPERATOR, "remove-failed",
                      f"{unit} is still {state.active} after stop; stop it by hand")
    return Result(remote.host.name, exits.OK, "removed", f"{unit} stopped, disabled and removed")


def disable_unit(remote, unit: str) -> None:
    """Keep a unit on disk but off at boot (the unit a switch replaced: the last good one)."""
    remote.run(systemd.disable(unit), check=False)


def stop_unit(remote, unit: str) -> None:
    """Stop and wait until systemd says inactive; the caller holds the host lock."""
    assert remote.lock is not None, "a unit is stopped under the host lock"
    remote.run(systemd.stop(unit), check=False, timeout=300)


def start_unit(remote, unit: str, command: str, timeout_s: float = 300) -> Result:
    """Start a unit again (after a refused switch) and confirm it answers /health."""
    try:
        with holding(remote, command):
            started = change.start_checked(remote, unit, timeout_s)
    except LockHeld as err:
        return Result(remote.host.name, exits.LOCKED, "locked", str(err))
    except RecoveryFailed as err:
        return Result(remote.host.name, exits.NEEDS_OPERATOR, "start-failed", str(err))
    return Result(remote.host.name, exits.OK, "started", f"{unit} is running again ({started})")


def health_of(remote, unit: str, timeout_s: float) -> GateSpec | None:
    return health_spec(remote.read_text(unit_paths(unit)[0]), remote.host.address, timeout_s)


@dataclass(frozen=True)
class UnitSnapshot:
    """What a unit ran before a change, kept in the switch's result file."""

    host: str
    unit: str
    exists: bool
    active: str
    profile: str | None
    hash: str | None
    entry: str | None
    url: str | None
    server_info: dict
    unit_text: str | None
    taken: float

    def as_dict(self) -> dict:
        return {k: v for k, v in self.__dict__.items()}


def snapshot(remote, unit: str) -> UnitSnapshot:
    """Read once: the unit, its env file and /server_info come from the status reading."""
    read = ops.read_unit(remote, unit)
    status, text = read.status, read.unit_text
    env = (lambda: read.env_text) if env_file_of(text) else (lambda: remote.read_text(unit_paths(unit)[1]))
    entry = _entry_running(remote, unit, text, env) if text is not None else None
    return UnitSnapshot(remote.host.name, unit, text is not None, status.active, status.profile,
                        status.hash, entry, status.url, read.server_info, text, time.time())


# the engine's names are re-exported so rollout code reaches the deploy engine through this module only.
__all__ = ["NO_UNIT", "LockHeld", "Result", "UnitSnapshot", "api_key_of", "begin_change", "change", "deploy", "dialable",
           "disable_unit", "health_of", "holding", "plan_of", "load_target", "pick_unit", "refusals", "remove_unit", "rollback", "snapshot",
           "start_unit", "stop_unit", "unit_paths", "unit_state", "unit_status", "units_on", "version_before"]
