"""Before anything starts: every candidate written as a profile, checked, and counted.

A candidate is a profile file that `extends` the base with its overrides (the tuned profile
the winner becomes is the same file, commented). Each goes through what a deploy would check
before touching the host: the profile rules, render, the planning checks against the host
(model and draft present, flags known, the draft loadable, the port free, the fit), and
beside a GPU production the memory production leaves free. One that fails any is skipped
with its reason and never started.
"""

from __future__ import annotations

import hashlib
import json
import os
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from ddops.profile import load_profile
from ddops.profile.loader import profile_file
from ddops.profile.yamlfile import ConfigError
from ddops.rollout import host_changes
from ddops.rollout.records import state_dir
from ddops.tune import space as spaces
from ddops.tune.measure import Load, Requirements

START_GUESS_S = 60     # a candidate's start and gate, until a candidate has started on the host
TOKEN_GUESS_S = 1 / 32  # a completion token's share of a level's wall time, until one was measured


@dataclass
class Candidate:
    id: str                  # spaces.candidate_id of its overrides
    overrides: dict
    label: str
    path: Path               # its profile file (extends the base)
    target: object = None    # host_changes target when it can run
    skipped: str | None = None

    def to_dict(self) -> dict:
        return {"candidate": self.label, "overrides": self.overrides, "profile_file": str(self.path),
                "skipped": self.skipped}


@dataclass(frozen=True)
class Pace:
    """How long a candidate took to start and pass its gate, and a completion token's share of
    a level's wall time, on one host: medians over the candidates started there before."""
    start_s: float = START_GUESS_S
    token_s: float = TOKEN_GUESS_S
    candidates: int = 0               # how many candidates the medians rest on
    host: str | None = None
    runtime: str | None = None

    @property
    def basis(self) -> str:
        return (f"measured: {self.candidates} {self.runtime} candidate(s) started on {self.host} before"
                if self.candidates
                else f"guessed: {START_GUESS_S} s a start, {TOKEN_GUESS_S * 1000:.0f} ms a token")


@dataclass
class Plan:
    base: object             # the base Profile
    base_file: Path
    host: str
    unit: str                # the candidates' unit
    port: int
    production_unit: str
    space: spaces.Space
    load: Load
    objective: str
    requirements: Requirements
    search: str              # grid | model
    trials: int              # candidates measured at most
    budget_s: float
    study: str
    folder: Path
    candidates: list[Candidate] = field(default_factory=list)
    spare: str | None = None          # where the candidates run, when not beside production
    reference: Candidate | None = None  # mirrored: the base profile itself, run first as the yardstick
    pace: Pace = field(default_factory=Pace)
    measured_before: int = 0          # candidates this study measured in an earlier run

    @property
    def runs_on(self) -> str:
        """The host the candidates run on: the spare one, else production's."""
        return self.spare or self.host

    @property
    def runnable(self) -> list[Candidate]:
        return [c for c in self.candidates if c.skipped is None]

    def load_tokens(self) -> int:
        """Completion tokens one endpoint is asked for over every level."""
        return len(self.load.prompts) * len(self.load.levels) * self.load.max_tokens

    def estimate_s(self) -> float:
        """Production's yardstick, then each candidate left: its start and gate, and the load,
        at the pace candidates started and answered on this host before (a guess until then).
        Mirrored, the traffic sets the pace: each candidate, the base's yardstick first, at
        most its start and the wait."""
        left = max(0, self.trials - self.measured_before)
        if self.load.mirrored:
            return (left + 1) * (self.pace.start_s + self.load.wait_s)
        per_load = self.load_tokens() * self.pace.token_s
        return per_load + left * (self.pace.start_s + per_load)

    def to_dict(self) -> dict:
        return {"profile": self.base.name, "host": self.host, "unit": self.unit, "port": self.port,
                "production_unit": self.production_unit, "space": self.space.to_dict(),
                "levels": list(self.load.levels), "prompts": len(self.load.prompts),
                "max_tokens": self.load.max_tokens, "mirrored": self.load.mirrored, "objective": self.objective,
                "requirements": self.requirements.__dict__, "search": self.search, "trials": self.trials,
                "budget_s": self.budget_s, "study": self.study, "folder": str(self.folder),
                "runnable": len(self.runnable), "skipped": len(self.candidates) - len(self.runnable),
                "runs_on": self.runs_on, "measured_before": self.measured_before,
                "estimate_s": round(self.estimate_s()), "estimate_basis": self.pace.basis,
                "candidates": [c.to_dict() for c in self.candidates]}


def study_name(base_file: Path, host: str, space: spaces.Space, load: Load, objective: str,
               requirements: Requirements, search: str, spare: str | None = None) -> str:
    """Same profile, hosts, space, load, objective and search: the same study (a rerun resumes it)."""
    what = json.dumps({"profile": base_file.read_text(), "host": host, "space": space.to_dict(), "search": search,
                       **({"spare": spare} if spare else {}),
                       **({"mirrored": {"count": load.count, "wait_s": load.wait_s}} if load.mirrored else {}),
                       "prompts": [p.text for p in load.prompts], "levels": load.levels,
                       "max_tokens": load.max_tokens, "objective": objective,
                       "requirements": requirements.__dict__}, sort_keys=True, default=str)
    return f"{base_file.stem}@{host}-{hashlib.sha256(what.encode()).hexdigest()[:10]}"


def write_profile(path: Path, base: str, overrides: dict, comment: list[str]) -> Path:
    """A profile that extends `base` with only `overrides`, its comment lines first."""
    head = "".join(f"# {line}\n" if line else "#\n" for line in comment)
    body = yaml.safe_dump({"extends": base, **spaces.nested(overrides)}, sort_keys=False)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(head + body)
    return path


def plan(profile_name: str, host: str, *, space_file: Path | None, load: Load, objective: str,
         requirements: Requirements, search: str, trials: int | None, budget_s: float,
         port: int | None, production_unit: str | None, inventory: Path | None, connect,
         spare: str | None = None) -> Plan:
    """Every candidate of the space checked on the host it will run on (`spare`, else
    production's); nothing is started. Bad input (profile, space file, production not running,
    a spare that is production's host) raises before any candidate is checked."""
    from ddops.exits import BadInput
    from ddops.rollout.shadow.lifecycle import production_of
    base_file = profile_file(profile_name)
    base = load_profile(str(base_file))
    space = spaces.load_space(space_file, base)
    prod_unit = production_unit or base.service.unit
    unit = f"{prod_unit.removesuffix('.service')}-tune.service"
    port = port or base.service.port + 2
    overrides = spaces.candidates(space, base)
    mode = search if search != "auto" else ("grid" if len(overrides) <= 8 else "model")
    if spare == host:
        raise BadInput(f"--on {spare}: that is production's host; leave --on out to run the candidates "
                       f"beside production")
    name = study_name(base_file, host, space, load, objective, requirements, mode, spare)
    folder = state_dir() / "tune" / name
    found = Plan(base, base_file, host, unit, port, prod_unit, space, load, objective, requirements,
                 mode, 0, budget_s, name, folder, spare=spare)
    with connect(host) as production_host, \
            (connect(spare) if spare else nullcontext(production_host)) as remote:   # one link when beside
        prod = production_of(production_host, prod_unit)        # production must run: it is the reference
        tap = _tap_unless_refused(production_host, base, prod, prod_unit) if load.mirrored else None
        if load.mirrored:
            found.reference = _checked(remote, found, {}, inventory)
            if found.reference.skipped:
                raise BadInput(f"--mirrored: the yardstick, {base.name} itself as {unit}, cannot run on "
                               f"{found.runs_on}: {found.reference.skipped}")
            ours = found.reference.target.spec.base_url.rstrip("/")
            if tap.get("target") not in (None, ours):    # a killed tuner's own target is taken back
                raise BadInput(f"--mirrored: production's tap already copies to {tap['target']} (a mirroring "
                               f"shadow); `ddops shadow abort` it first, or tune from --prompts")
        for chosen in overrides:
            found.candidates.append(_checked(remote, found, chosen, inventory))
    runnable = len(found.runnable)
    default = runnable if mode == "grid" else max(6, runnable // 3)
    found.trials = min(runnable, trials if trials is not None else default)
    return found


def _checked(remote, plan_: Plan, overrides: dict, inventory: Path | None) -> Candidate:
    cid = spaces.candidate_id(overrides)
    stem = f"{plan_.base_file.stem}-tune-{hashlib.sha256(cid.encode()).hexdigest()[:6]}"
    path = plan_.folder / "candidates" / f"{stem}.yaml"
    write_profile(path, extends_of(plan_.base_file, path), overrides,
                  [f"ddops tune candidate of {plan_.base_file.stem} (study {plan_.study})"])
    candidate = Candidate(cid, overrides, spaces.label(overrides), path)
    try:
        target = host_changes.load_target(str(path), plan_.runs_on, inventory=inventory, unit_name=plan_.unit,
                                          port=plan_.port)
    except ConfigError as err:
        candidate.skipped = "; ".join(getattr(err, "problems", None) or [str(err)])
        return candidate
    refused = host_changes.refusals(remote, target)
    if not refused:
        refused = _beside_production(remote, target.profile)
    if refused:
        candidate.skipped = "; ".join(str(r) for r in refused)
    else:
        candidate.target = target
    return candidate


def _tap_unless_refused(remote, base, prod, prod_unit: str) -> dict:
    """Mirrored load (exit 2 before anything starts): the candidates' runtime has a mirror sink,
    production's tap lets ddops point it (its profile set service.mirror). A production that
    mirrors through its request logs (the relay) is not tuned from mirrored traffic: the relay
    is a shadow's. Production's GET /mirror: where its tap copies to now."""
    from ddops.exits import BadInput
    from ddops.rollout.shadow import mirrored
    from ddops.rollout.shadow.compare import Endpoint
    from ddops.rollout.shadow.lifecycle import api_key_of
    with host_changes.dialable(remote.host, prod.url) as url:
        endpoint = Endpoint("production", url, api_key=api_key_of(base))
        source = mirrored.refuse_unless_mirrorable(base, remote.host, remote.read_text(
            host_changes.unit_paths(prod_unit)[0]), endpoint)
        if source.kind != "tap":
            raise BadInput(f"--mirrored: production {prod_unit} mirrors through its request logs (the relay a "
                           f"mirroring shadow starts); tune reads a bundled production's tap. Use --prompts, "
                           f"or `ddops shadow start --mirror` for one candidate (docs/tune.md)")
        return mirrored.tap_of(endpoint)


def _beside_production(remote, profile) -> list[str]:
    """A GPU candidate gets only the memory production leaves free (the shadow's rule)."""
    from ddops.exits import BadInput
    from ddops.rollout.shadow.lifecycle import refuse_unless_fits
    try:
        refuse_unless_fits(remote, profile)
    except BadInput as err:
        return [f"fit: {err}"]
    return []


def extends_of(base: Path, child: Path) -> str:
    """How `child` names `base` in `extends`: by name beside it, else by a path relative to it."""
    base, folder = base.resolve(), child.resolve().parent
    return base.stem if base.parent == folder else os.path.relpath(base, folder)
