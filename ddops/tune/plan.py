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

START_GUESS_S = 60     # a candidate's start and gate, until the study has measured one


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

    @property
    def runnable(self) -> list[Candidate]:
        return [c for c in self.candidates if c.skipped is None]

    def estimate_s(self) -> float:
        """A guess: each candidate's start and gate, plus 1 s a request at each level."""
        return self.trials * (START_GUESS_S + len(self.load.prompts) * len(self.load.levels))

    def to_dict(self) -> dict:
        return {"profile": self.base.name, "host": self.host, "unit": self.unit, "port": self.port,
                "production_unit": self.production_unit, "space": self.space.to_dict(),
                "levels": list(self.load.levels), "prompts": len(self.load.prompts),
                "max_tokens": self.load.max_tokens, "objective": self.objective,
                "requirements": self.requirements.__dict__, "search": self.search, "trials": self.trials,
                "budget_s": self.budget_s, "study": self.study, "folder": str(self.folder),
                "runnable": len(self.runnable), "skipped": len(self.candidates) - len(self.runnable),
                "estimate_s": round(self.estimate_s()),
                "candidates": [c.to_dict() for c in self.candidates]}


def study_name(base_file: Path, host: str, space: spaces.Space, load: Load, objective: str,
               requirements: Requirements, search: str) -> str:
    """Same profile, host, space, load, objective and search: the same study (a rerun resumes it)."""
    what = json.dumps({"profile": base_file.read_text(), "host": host, "space": space.to_dict(), "search": search,
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
         port: int | None, production_unit: str | None, inventory: Path | None, connect) -> Plan:
    """Every candidate of the space checked on the host; nothing is started. Bad input
    (profile, space file, production not running) raises before any candidate is checked."""
    from ddops.rollout.shadow.lifecycle import production_of
    base_file = profile_file(profile_name)
    base = load_profile(str(base_file))
    space = spaces.load_space(space_file, base)
    prod_unit = production_unit or base.service.unit
    unit = f"{prod_unit.removesuffix('.service')}-tune.service"
    port = port or base.service.port + 2
    overrides = spaces.candidates(space, base)
    mode = search if search != "auto" else ("grid" if len(overrides) <= 8 else "model")
    name = study_name(base_file, host, space, load, objective, requirements, mode)
    folder = state_dir() / "tune" / name
    found = Plan(base, base_file, host, unit, port, prod_unit, space, load, objective, requirements,
                 mode, 0, budget_s, name, folder)
    with connect(host) as remote:
        production_of(remote, prod_unit)        # production must run: it is the reference
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
        target = host_changes.load_target(str(path), plan_.host, inventory=inventory, unit_name=plan_.unit,
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
