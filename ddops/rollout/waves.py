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

import yaml

PENDING, RUNNING, DONE, FAILED = "pending", "running", "done", "failed"
REVERTED, REVERT_FAILED, LOCKED = "reverted", "revert_failed", "locked"
PLAN_KEYS = {"profile", "hosts", "selector", "canary", "wave_size", "max_failures", "bake_s"}


class PlanError(ValueError):
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

    @property
    def digest(self) -> str:
        """Identifies the plan's content, so a changed plan is never resumed as the old one."""
        body = json.dumps({k: v for k, v in asdict(self).items() if k != "source"}, sort_keys=True)
        return hashlib.sha256(body.encode()).hexdigest()[:12]


def load_plan(path: Path) -> RolloutPlan:
    try:
        data = yaml.safe_load(Path(path).read_text())
    except OSError as exc:
        raise PlanError(f"{path}: cannot read ({exc.strerror})") from None
    except yaml.YAMLError as exc:
        raise PlanError(f"{path}: not YAML ({str(exc).splitlines()[0]})") from None
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
                       bake_s=_seconds(data, "bake_s", source))


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
    status: str = RUNNING  # running, reverting, then succeeded, failed (within tolerance), halted
    canary: int = 0  # hosts in the first wave that are canaries

    @classmethod
    def start(cls, plan: RolloutPlan, waves: tuple[tuple[str, ...], ...],
              canary: int = 0) -> "RolloutState":
        return cls(plan.digest, plan.profile, waves,
                   {h: HostState() for wave in waves for h in wave}, canary=canary)

    @property
    def finished(self) -> bool:
        return self.status not in (RUNNING, "reverting")

    def with_host(self, host: str, status: str, *, changed: bool | None = None,
                  detail: str = "", before: str | None = None) -> "RolloutState":
        old = self.hosts[host]
        new = HostState(status, old.changed if changed is None else changed, detail,
                        old.before if before is None else before)
        return replace(self, hosts={**self.hosts, host: new})

    def with_status(self, status: str) -> "RolloutState":
        return replace(self, status=status)

    def count(self, *statuses: str) -> int:
        return sum(h.status in statuses for h in self.hosts.values())

    def pending_waves(self) -> list[tuple[str, ...]]:
        """Waves still to run, without hosts already finished (resume skips them)."""
        todo = [tuple(h for h in w if self.hosts[h].status in (PENDING, RUNNING)) for w in self.waves]
        return [w for w in todo if w]

    def must_halt(self, max_failures: int) -> bool:
        return self.count(FAILED, LOCKED, REVERT_FAILED) > max_failures

    def to_revert(self) -> list[str]:
        """Hosts this rollout changed and left on the new profile."""
        return [h for wave in self.waves for h in wave
                if self.hosts[h].status in (DONE, RUNNING) and self.hosts[h].changed]

    def to_dict(self) -> dict:
        return {"plan_digest": self.plan_digest, "profile": self.profile, "status": self.status,
                "canary": self.canary, "waves": [list(w) for w in self.waves],
                "hosts": {h: asdict(s) for h, s in self.hosts.items()}}

    @classmethod
    def from_dict(cls, data: dict) -> "RolloutState":
        return cls(data["plan_digest"], data["profile"], tuple(tuple(w) for w in data["waves"]),
                   {h: HostState(**s) for h, s in data["hosts"].items()}, data["status"],
                   data.get("canary", 0))


def exit_code(state: RolloutState) -> int:
    """The CI contract: 0 all done, 1 failures reverted, 3 a host needs an operator, 4 lock held."""
    if state.count(REVERT_FAILED):
        return 3
    if state.count(FAILED):
        return 1
    if state.count(LOCKED):
        return 4
    return 0 if state.status == "succeeded" else 1
