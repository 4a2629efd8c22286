"""Pure core of a fleet rollout: the plan file, wave order, and the resumable state.

A rollout deploys one profile to many hosts: the canary hosts first, then waves of
`wave_size` in parallel. After each wave, more than `max_failures` failed hosts halts the
rollout and every host it changed is reverted. The state records each host's outcome so an
interrupted rollout resumes where it stopped. No I/O beyond reading the plan file.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from pydantic import ValidationError

from ddops import exits
from ddops.profile.analysis import AnalysisSpec
from ddops.profile.yamlfile import load_data

PENDING, RUNNING, DONE, FAILED = "pending", "running", "done", "failed"
REVERTED, REVERT_FAILED, LOCKED = "reverted", "revert-failed", "locked"
SPELLED = {"revert_failed": REVERT_FAILED}   # state files written before one spelling of each result
UNREACHABLE = "unreachable"     # no connection opened: nothing on the host changed
REFUSED = "refused"   # planning knew the host's change cannot start: nothing on it changed
NOT_DONE = (FAILED, LOCKED, REVERT_FAILED, UNREACHABLE, REFUSED)    # each counts against max_failures
PAUSED = "paused"
PLAN_KEYS = {"profile", "hosts", "selector", "canary", "wave_size", "max_failures", "bake_s",
             "analysis", "pause_after", "notify"}


class PlanError(exits.BadInput, ValueError):
    """One line naming the plan file, the key and the reason."""


@dataclass(frozen=True)
class RolloutPlan:
    source: str
    profile: str
    hosts: tuple[str, ...] = ()
    selector: tuple[tuple[str, str], ...] = ()  # label pairs; used when hosts is empty
    canary: int | None = None  # None: from the profile's rollout policy
    wave_size: int | None = None
    max_failures: int | None = None
    bake_s: float | None = None
    analysis: AnalysisSpec | None = None  # None: from the profile's rollout policy
    pause_after: tuple[str, ...] | None = None  # "canary" or wave numbers as the table shows them
    notify: tuple[dict, ...] = ()  # webhooks (ddops.rollout.fleet.notify), beside the inventory's

    @property
    def digest(self) -> str:
        """Identifies the plan's content, so a changed plan is never resumed as the old one."""
        fields = {k: v for k, v in asdict(self).items() if k not in ("source", "notify")}
        body = json.dumps(fields, sort_keys=True, default=lambda o: o.model_dump())
        return hashlib.sha256(body.encode()).hexdigest()[:12]


def load_plan(path: Path) -> RolloutPlan:
    data, _, problems = load_data(Path(path))   # the bounded reader every config file goes through
    if problems:
        raise PlanError(problems[0])
    return parse_plan(data, str(path))


def parse_plan(data: object, source: str) -> RolloutPlan:
    if not isinstance(data, dict):
        raise PlanError(f"{source}: expected a mapping with 'profile' and 'hosts' or 'selector'")
    unknown = sorted(set(data) - PLAN_KEYS)
    if unknown:
        raise PlanError(f"{source}: {unknown[0]}: unknown key (known: {', '.join(sorted(PLAN_KEYS))})")
    if not isinstance(data.get("profile"), str) or not data["profile"]:
        raise PlanError(f"{source}: profile: required, the name of a profile")
    hosts, selector = data.get("hosts") or [], data.get("selector") or {}
    if not isinstance(hosts, list) or not all(isinstance(h, str) for h in hosts):
        raise PlanError(f"{source}: hosts: must be a list of host names")
    if len(set(hosts)) != len(hosts):
        raise PlanError(f"{source}: hosts: a host is listed twice")
    if not isinstance(selector, dict):
        raise PlanError(f"{source}: selector: must be a mapping of label: value")
    if bool(hosts) == bool(selector):
        raise PlanError(f"{source}: hosts/selector: give exactly one of them")
    return RolloutPlan(source=source, profile=data["profile"], hosts=tuple(hosts),
                       selector=tuple(sorted((str(k), str(v)) for k, v in selector.items())),
                       canary=_count(data, "canary", source, 0),
                       wave_size=_count(data, "wave_size", source, 1),
                       max_failures=_count(data, "max_failures", source, 0),
                       bake_s=_seconds(data, "bake_s", source),
                       analysis=_analysis(data.get("analysis"), source),
                       pause_after=_pause_points(data.get("pause_after"), source),
                       notify=_notify(data.get("notify"), source))


def _analysis(value: object, source: str) -> AnalysisSpec | None:
    if value is None:
        return None
    try:
        return AnalysisSpec.model_validate(value)
    except ValidationError as exc:
        error = exc.errors()[0]
        where = ".".join(str(p) for p in error["loc"])
        raise PlanError(f"{source}: analysis{'.' + where if where else ''}: {error['msg']}") from None


def _pause_points(value: object, source: str) -> tuple[str, ...] | None:
    if value is None:
        return None
    points = value if isinstance(value, list) else [value]
    if not all(p == "canary" or (isinstance(p, int) and not isinstance(p, bool) and p >= 1)
               for p in points):
        raise PlanError(f"{source}: pause_after: 'canary' or wave numbers (1, 2, ...), got {value!r}")
    return tuple(str(p) for p in points)


def _notify(value: object, source: str) -> tuple[dict, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
        raise PlanError(f"{source}: notify: a list of webhooks ({{url: ...}} or {{url_env: NAME}})")
    return tuple(value)


def pause_waves(points: tuple[str, ...], waves: tuple[tuple[str, ...], ...], canary: int,
                source: str) -> tuple[int, ...]:
    """Wave indexes to pause after; numbers count waves as the table shows them (the canary
    wave is `canary`, the next is 1); pausing after the last wave is pointless and refused."""
    indexes = []
    for point in points:
        if point == "canary":
            if not canary:
                raise PlanError(f"{source}: pause_after: canary, but the plan has no canary")
            index = 0
        else:
            index = int(point) - (0 if canary else 1)
        if not 0 <= index < len(waves) - 1:
            raise PlanError(f"{source}: pause_after: {point}: no wave after it to wait for "
                            f"({len(waves)} wave(s))")
        indexes.append(index)
    return tuple(sorted(set(indexes)))


def _count(data: dict, key: str, source: str, minimum: int) -> int | None:
    value = data.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise PlanError(f"{source}: {key}: must be an integer >= {minimum}, got {value!r}")
    return value


def _seconds(data: dict, key: str, source: str) -> float | None:
    value = data.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 86400:
        raise PlanError(f"{source}: {key}: must be a number of seconds in 0..86400, got {value!r}")
    return float(value)


def plan_waves(hosts: tuple[str, ...], canary: int, wave_size: int) -> tuple[tuple[str, ...], ...]:
    """Canary wave (the first `canary` hosts) then waves of `wave_size`, in the given order."""
    if wave_size < 1:
        raise ValueError("wave_size must be >= 1")
    head, rest = hosts[:canary], hosts[canary:]
    waves = [head] if head else []
    waves += [rest[i:i + wave_size] for i in range(0, len(rest), wave_size)]
    return tuple(waves)


@dataclass(frozen=True)
class HostState:
    status: str = PENDING
    changed: bool = False  # this rollout changed the host's unit: revert it on halt
    detail: str = ""
    before: str | None = None  # what the host ran before this rollout (a history id), for revert


@dataclass(frozen=True)
class RolloutState:
    plan_digest: str
    profile: str
    waves: tuple[tuple[str, ...], ...]
    hosts: dict = field(default_factory=dict)  # host -> HostState
    # running, reverting, paused, then succeeded, failed (within tolerance), halted, aborted
    status: str = RUNNING
    canary: int = 0  # hosts in the first wave that are canaries
    analysis: dict = field(default_factory=dict)  # host -> {baseline, samples, verdict}
    paused_at: int | None = None  # index of the wave after which the rollout waits
    approved: tuple[int, ...] = ()  # pauses already approved (so a resume does not stop again)
    timeline: tuple = ()  # {time, host, status, detail} and {time, event, ...}, in order (reports)
    runner: dict | None = None  # the process running it now (lock.Holder.as_dict(), with its command)

    @classmethod
    def start(cls, plan: RolloutPlan, waves: tuple[tuple[str, ...], ...],
              canary: int = 0) -> "RolloutState":
        return cls(plan.digest, plan.profile, waves,
                   {h: HostState() for wave in waves for h in wave}, canary=canary)

    @property
    def finished(self) -> bool:
        return self.status not in (RUNNING, "reverting", PAUSED)

    def with_host(self, host: str, status: str, *, changed: bool | None = None,
                  detail: str = "", before: str | None = None) -> "RolloutState":
        old = self.hosts[host]
        new = HostState(status, old.changed if changed is None else changed, detail,
                        old.before if before is None else before)
        return replace(self, hosts={**self.hosts, host: new})

    def with_status(self, status: str) -> "RolloutState":
        return replace(self, status=status)

    def paused(self, wave: int) -> "RolloutState":
        return replace(self, status=PAUSED, paused_at=wave)

    def approve(self) -> "RolloutState":
        return replace(self, status=RUNNING, paused_at=None,
                       approved=(*self.approved, self.paused_at))

    def logged(self, entry: dict) -> "RolloutState":
        return replace(self, timeline=(*self.timeline, entry))

    def with_analysis(self, host: str, kind: str, data: dict) -> "RolloutState":
        """kind: baseline or verdict (set), sample (appended)."""
        record = dict(self.analysis.get(host) or {"baseline": None, "samples": [], "verdict": None})
        if kind == "sample":
            record["samples"] = [*record["samples"], data]
        else:
            record[kind] = data
        return replace(self, analysis={**self.analysis, host: record})

    def count(self, *statuses: str) -> int:
        return sum(h.status in statuses for h in self.hosts.values())

    def pending_waves(self) -> list[tuple[str, ...]]:
        """Waves still to run, without hosts already finished (resume skips them)."""
        todo = [tuple(h for h in w if self.hosts[h].status in (PENDING, RUNNING)) for w in self.waves]
        return [w for w in todo if w]

    def must_halt(self, max_failures: int) -> bool:
        return self.count(*NOT_DONE) > max_failures

    def to_revert(self) -> list[str]:
        """Hosts this rollout changed and left on the new profile (a revert that failed is tried again)."""
        return [h for wave in self.waves for h in wave
                if self.hosts[h].status in (DONE, RUNNING, REVERT_FAILED) and self.hosts[h].changed]

    def to_dict(self) -> dict:
        return {"plan_digest": self.plan_digest, "profile": self.profile, "status": self.status,
                "canary": self.canary, "waves": [list(w) for w in self.waves],
                "hosts": {h: asdict(s) for h, s in self.hosts.items()}, "analysis": self.analysis,
                "paused_at": self.paused_at, "approved": list(self.approved),
                "timeline": list(self.timeline), "runner": self.runner}

    @classmethod
    def from_dict(cls, data: dict) -> "RolloutState":
        hosts = {h: HostState(**{**s, "status": SPELLED.get(s["status"], s["status"])})
                 for h, s in data["hosts"].items()}
        return cls(data["plan_digest"], data["profile"], tuple(tuple(w) for w in data["waves"]),
                   hosts, data["status"],
                   data.get("canary", 0), data.get("analysis", {}), data.get("paused_at"),
                   tuple(data.get("approved", ())), tuple(data.get("timeline", ())), data.get("runner"))


def exit_code(state: RolloutState) -> int:
    """The CI contract, through the one severity order of exits.worst: 3 a host needs an
    operator, 6 a host could not be reached, 1 failures reverted (or aborted), 4 lock held,
    2 refused by planning with no host changed at all (a refusal after others changed counts as
    a failure, 1); 5 paused for approval unless a host needs an operator; 0 all done."""
    touched = any(h.changed or h.status in (FAILED, REVERTED, REVERT_FAILED) for h in state.hosts.values())
    refused = exits.FAILED if touched else exits.BAD_INPUT
    codes = {REVERT_FAILED: exits.NEEDS_OPERATOR, UNREACHABLE: exits.UNREACHABLE, FAILED: exits.FAILED,
             LOCKED: exits.LOCKED, REFUSED: refused}
    worst = exits.worst(codes[h.status] for h in state.hosts.values() if h.status in codes)
    if worst == exits.NEEDS_OPERATOR:
        return worst
    if state.status == PAUSED:
        return exits.PAUSED
    if worst != exits.OK:
        return worst
    return exits.OK if state.status == "succeeded" else exits.FAILED