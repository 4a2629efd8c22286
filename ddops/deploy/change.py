"""A host change that spans units, recorded on the host before its first step.

A deploy marks its own unit (deploy/<unit>/pending.json, apply.py). A change that stops one unit
and deploys another (a switch; an in-place shadow promote) needs more: if ddops dies between the
stop and the new unit's gate, production is down and only the host can say so. So such a change
writes STATE/change.json, under the host lock and before it touches anything, saying:

  what it is doing      command, holder, started, stage
  what production was   each unit it may stop, and whether it was active and enabled
  how to finish it      the target unit and the hash it gets: reached once a passed history entry
                        of that hash was written since the change began; then `disable` is done
  how to undo it        the target unit's unfinished deploy is recovered (its backup restored),
                        then each production unit that was active is started and checked healthy

`holding` is how every command that changes a host takes its lock: the first taker on a
connection settles a change a dead holder left (finish or undo, and says which) before its own
work. `interrupted` tells `ddops status` what a dead holder left; `recover_host` settles it alone
(`ddops recover`).
"""

from __future__ import annotations

import json
import shlex
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from typing import Iterator

from ddops import systemd
from ddops.deploy import history, lease
from ddops.deploy.desired import health_spec
from ddops.deploy.facts import STATE, read_facts, unit_state
from ddops.deploy.gate import run_health
from ddops.deploy.lock import Holder, HostLock, current_holder, describe
from ddops.deploy.recover import RecoveryFailed, at_paths, recover, unit_paths
from ddops.deploy.tunnel import reachable
from ddops.deploy.unitwatch import UnitWatch

q = shlex.quote
CHANGE = f"{STATE}/change.json"
RUNNING = ("active", "activating", "reloading")
HEALTH_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class Was:
    """A unit as production had it before the change."""
    unit: str
    active: bool
    enabled: bool


@dataclass(frozen=True)
class Change:
    command: str
    holder: dict
    started: float
    production: tuple[Was, ...]
    target_unit: str
    target_hash: str                 # the profile hash the target unit gets
    disable: tuple[str, ...] = ()    # turned off once the target is reached (a switch's old unit)
    stage: str = "begun"

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> "Change":
        """ValueError for anything that is not a change record (a host's file is input like any other)."""
        try:
            data = json.loads(text)
            production = tuple(Was(str(w["unit"]), bool(w["active"]), bool(w["enabled"]))
                               for w in data["production"])
            return cls(str(data["command"]), dict(data.get("holder") or {}), float(data["started"]),
                       production, str(data["target_unit"]), str(data["target_hash"]),
                       tuple(str(u) for u in data.get("disable") or ()), str(data.get("stage") or "?"))
        except (ValueError, TypeError, KeyError, AttributeError) as err:
            raise ValueError(f"{CHANGE} is not a change record ({err})") from None

    def reached(self, entries: list[history.Entry]) -> bool:
        """Pure: the target passed its gate since this change began (its deploy's own record)."""
        return any(e.record.result == "passed" and e.record.hash == self.target_hash
                   and e.record.finished >= self.started for e in entries)


def was(remote, unit: str) -> Was:
    state = unit_state(remote, unit)
    return Was(unit, state.active in RUNNING, state.enabled == "enabled")


def begin(remote, change: Change) -> Change:
    """Write the record; the caller holds the host lock and has not touched the host yet."""
    assert remote.lock is not None, "a change is recorded under the host lock"
    remote.write(CHANGE, change.to_json())
    return change


def advance(remote, change: Change, stage: str) -> Change:
    moved = replace(change, stage=stage)
    remote.write(CHANGE, moved.to_json())
    return moved


def end(remote) -> None:
    remote.run(f"rm -f {q(CHANGE)}")


def read(remote) -> Change | None:
    text = remote.read_text(CHANGE)
    if text is None:
        return None
    try:
        return Change.from_json(text)
    except ValueError as err:
        raise RecoveryFailed(f"{remote.host.name}: {err}; read it, put the host right by hand and "
                             f"remove it") from None


@contextmanager
def holding(remote, holder: Holder, progress=lambda stage, text: None) -> Iterator[HostLock]:
    """The host lock for one whole change. The first taker on this connection notes a stale
    lock and settles what a dead holder left (`lock.notes` says what it did); a nested taker joins."""
    with HostLock(remote, holder) as lock:
        if not lock.joined:
            if lock.broken:
                lock.notes.append(f"released the lock of {describe(lock.broken)}: that process is gone "
                                  "from this machine (killed while its connection was down)")
            elif lock.stale:
                lock.notes.append(f"recovered a stale lock left by {describe(lock.stale)}")
            found = read(remote)
            if found is not None:
                lock.notes.append(settle(remote, found, progress))
            ended = lease.settle(remote)      # candidates of a tuner that is gone
            if ended:
                lock.notes.append(ended)
        yield lock


def settle(remote, change: Change, progress=lambda stage, text: None) -> str:
    """Finish a change whose target passed its gate, else undo it; returns which, in words."""
    who = describe(change.holder)
    progress("recover", f"settling `{change.command}` left at its {change.stage} stage by {who}")
    if change.reached(history.entries(remote, change.target_unit)):
        for unit in change.disable:
            remote.run(systemd.disable_now(unit), check=False)
        done = f"{change.target_unit} passed its gate" + \
            (f"; {', '.join(change.disable)} stopped and disabled" if change.disable else "")
        text = f"finished the interrupted `{change.command}` by {who}: {done}"
    else:
        text = f"undid the interrupted `{change.command}` by {who}: {'; '.join(_undo(remote, change, progress))}"
    end(remote)
    return text


def _undo(remote, change: Change, progress) -> list[str]:
    """The target's unfinished deploy recovered, then production as it was."""
    said = []
    target = at_paths(change.target_unit)
    facts = read_facts(remote, target.unit_name, target.unit_path, target.env_path)
    if facts.pending:
        said.append(recover(remote, target, facts, HEALTH_TIMEOUT_S, progress))
    for unit in change.production:
        said.append(_as_it_was(remote, unit, progress))
    return said


def _as_it_was(remote, unit: Was, progress) -> str:
    state = unit_state(remote, unit.unit)
    if unit.enabled and state.enabled != "enabled":
        remote.run(systemd.enable(unit.unit))
    if not unit.active:
        return f"{unit.unit} was not running; left as it is"
    if state.active in RUNNING:
        return f"{unit.unit} still running"
    progress("restore", f"starting {unit.unit} again")
    return start_checked(remote, unit.unit)


def start_checked(remote, unit: str, timeout_s: float = HEALTH_TIMEOUT_S) -> str:
    """Start a unit and wait until it answers /health; RecoveryFailed (exit 3) when it does not."""
    remote.run(systemd.start_no_block(unit))
    spec = health_spec(remote.read_text(unit_paths(unit)[0]), remote.host.address, timeout_s)
    if spec is None:
        return f"{unit} started (no endpoint to check)"
    with reachable(remote, spec.base_url) as url, UnitWatch(remote, unit) as watch:
        report = run_health(replace(spec, base_url=url), watch)
    if not report.passed:
        raise RecoveryFailed(f"{remote.host.name}: {unit} started but not healthy: "
                             f"{report.failure.detail}; the service is down")
    return f"{unit} started and healthy"


def interrupted(remote) -> list[dict]:
    """What dead holders left on the host (none while a live one holds the lock): the change
    record and every unit's unfinished deploy, each with the command that settles it."""
    if current_holder(remote) is not None:
        return []
    found = remote.run(f"for f in {q(CHANGE)} {q(STATE)}/deploy/*/pending.json; do [ -f \"$f\" ] && "
                       "printf '%s\\t' \"$f\" && tr -d '\\n' < \"$f\" && echo; done; true").stdout
    nxt = f"ddops recover --host {remote.host.name}"
    left = []
    for line in found.splitlines():
        path, _, body = line.partition("\t")
        left.append(_told(path, body, nxt))
    tuned = lease.left(remote)
    if tuned is not None:
        holder, units = tuned
        left.append({"what": (holder or {}).get("command") or "ddops tune", "stage": "tuning",
                     "holder": holder, "since": (holder or {}).get("since"), "production": [],
                     "candidates": units, "next": nxt})
    return left


def _told(path: str, body: str, nxt: str) -> dict:
    """One thing a dead holder left, in the words `ddops status` prints."""
    try:
        if path == CHANGE:
            change = Change.from_json(body)
            stopped = [w.unit for w in change.production if w.active]
            return {"what": change.command, "stage": change.stage, "holder": change.holder,
                    "since": change.started, "production": stopped, "next": nxt}
        pending = json.loads(body)
        unit = path.split("/")[-2]
        return {"what": f"deploy of {pending.get('profile')} as {unit}", "stage": pending.get("stage"),
                "holder": pending.get("holder"), "since": pending.get("started"), "production": [unit],
                "next": nxt}
    except (ValueError, AttributeError) as err:
        return {"what": f"unreadable {path} ({err})", "stage": "?", "holder": None, "since": None,
                "production": [], "next": "read it and put the host right by hand"}


def preview(remote) -> list[str]:
    """What `recover` would do now, read only: finish or undo the change record (by the same
    test settle uses), restore each unfinished deploy's backup."""
    said = []
    found = read(remote)
    if found is not None:
        if found.reached(history.entries(remote, found.target_unit)):
            said.append(f"finish `{found.command}`: {found.target_unit} passed its gate"
                        + (f"; stop and disable {', '.join(found.disable)}" if found.disable else ""))
        else:
            running = [w.unit for w in found.production if w.active]
            said.append(f"undo `{found.command}`: recover {found.target_unit}'s unfinished deploy if any"
                        + (f", then start {', '.join(running)} and check it is healthy" if running else ""))
    said += [f"restore the backup of {unit} left by its unfinished deploy" for unit in pending_units(remote)
             if found is None or unit != found.target_unit]
    return said


def pending_units(remote) -> list[str]:
    """The units whose deploy was cut short (a pending.json in their deploy/ folder)."""
    listed = remote.run(f"ls {q(STATE)}/deploy/*/pending.json 2>/dev/null; true").stdout.split()
    return [path.split("/")[-2] for path in listed]


def recover_host(remote, holder: Holder, progress=lambda stage, text: None) -> list[str]:
    """Settle everything a dead holder left: the change record (by `holding`), then every unit's
    unfinished deploy. Raises LockHeld while a live holder works on the host."""
    with holding(remote, holder, progress) as lock:
        said = list(lock.notes)
        for name in pending_units(remote):
            unit = at_paths(name)
            facts = read_facts(remote, unit.unit_name, unit.unit_path, unit.env_path)
            if facts.pending:
                said.append(recover(remote, unit, facts, HEALTH_TIMEOUT_S, progress))
    return said

