"""Find, read and resolve profiles: YAML files -> extends chain -> merged data -> Profile.

Every problem is collected first and raised together as one ProfileError; nothing
half-loaded escapes.
"""

from __future__ import annotations

import difflib
import os
from pathlib import Path

from pydantic import ValidationError

from ddops.profile.problems import located, schema_problem
from ddops.profile.rules import contradictions
from ddops.profile.schema import Profile
from ddops.profile.yamlfile import ConfigError, YamlDoc, dotted, problem, read_yaml

REPO_PROFILES = Path(__file__).resolve().parents[2] / "profiles"
SUFFIXES = (".yaml", ".yml")


class ProfileError(ConfigError):
    """A profile that cannot be used; `.problems` holds one line per problem."""


def profiles_dir(explicit: Path | None = None) -> Path:
    """--profiles-dir > $DDOPS_PROFILES > profiles/ of the repository."""
    if explicit is not None:
        return Path(explicit)
    return Path(os.environ.get("DDOPS_PROFILES") or REPO_PROFILES)


def list_profiles(profiles_dir_: Path | None = None) -> list[str]:
    folder = profiles_dir(profiles_dir_)
    return sorted(p.stem for p in folder.iterdir() if p.suffix in SUFFIXES) if folder.is_dir() else []


def profile_file(name_or_path: str, profiles_dir_: Path | None = None) -> Path:
    """A profile name (looked up in the profiles dir) or a path to a YAML file."""
    folder = profiles_dir(profiles_dir_)
    as_path = Path(name_or_path)
    if as_path.suffix in SUFFIXES or os.sep in name_or_path:
        if as_path.is_file():
            return as_path
        raise ProfileError([problem(name_or_path, None, "no such file")])
    for suffix in SUFFIXES:
        if (folder / f"{name_or_path}{suffix}").is_file():
            return folder / f"{name_or_path}{suffix}"
    known = list_profiles(folder)
    close = difflib.get_close_matches(name_or_path, known, n=1)
    hint = f"did you mean {close[0]!r}?" if close else f"known: {', '.join(known) or 'none'}"
    raise ProfileError([problem(name_or_path, None, f"no such profile in {folder} ({hint})")])


def load_profile(name_or_path: str, profiles_dir: Path | None = None) -> Profile:
    path = profile_file(name_or_path, profiles_dir)
    chain = _read_chain(path, profiles_dir)
    merged, where = _merge(chain)
    profile = _validate(merged, chain[0], where)
    profile._files = tuple(doc.display for doc in chain)
    profile._sources = {key: file for key, (file, _) in where.items()}
    return profile


def _read_chain(path: Path, folder: Path | None) -> list[YamlDoc]:
    """The file and its ancestors, leaf first. Missing parents and cycles are problems."""
    chain: list[YamlDoc] = []
    seen: list[Path] = []
    while True:
        doc, problems = read_yaml(path)
        if problems:
            raise ProfileError(problems)
        if not isinstance(doc.data, dict):
            kind = type(doc.data).__name__ if doc.data is not None else "an empty file"
            raise ProfileError([problem(doc.display, None, f"top level must be a mapping, got {kind}")])
        chain.append(doc)
        seen.append(path.resolve())
        parent = doc.data.get("extends")
        if parent is None:
            return chain
        line = doc.lines.get(("extends",))
        if not isinstance(parent, str):
            raise ProfileError([problem(doc.display, "extends", "must be a profile name", line)])
        path = _parent_file(parent, doc, folder, line)
        if path.resolve() in seen:
            cycle = " -> ".join([p.stem for p in seen] + [path.stem])
            raise ProfileError([problem(doc.display, "extends", f"cycle: {cycle}", line)])


def _parent_file(parent: str, child: YamlDoc, folder: Path | None, line: int | None) -> Path:
    if os.sep in parent:       # a path, relative to the child's folder (`ddops tune` candidates)
        path = child.path.parent / parent
        if path.suffix in SUFFIXES and path.is_file():
            return path
        raise ProfileError([problem(child.display, "extends", f"no profile file {parent!r}", line)])
    for candidate_dir in (child.path.parent, profiles_dir(folder)):
        for suffix in SUFFIXES:
            candidate = candidate_dir / f"{parent}{suffix}"
            if candidate.is_file():
                return candidate
    places = sorted({str(child.path.parent), str(profiles_dir(folder))})
    reason = f"unknown parent profile {parent!r} (looked in {', '.join(places)})"
    raise ProfileError([problem(child.display, "extends", reason, line)])


def _merge(chain: list[YamlDoc]) -> tuple[dict, dict[str, tuple[str, int | None]]]:
    """Deep-merge root first; `where` maps each dotted key to (file, line) of its last setter."""
    merged: dict = {}
    where: dict[str, tuple[str, int | None]] = {}
    for doc in reversed(chain):
        data = {k: v for k, v in doc.data.items() if k != "extends"}
        merged = _deep_merge(merged, data)
        for key, line in doc.lines.items():
            where[dotted(key)] = (doc.display, line)
    merged["extends"] = chain[0].data.get("extends")
    return merged, where


def _deep_merge(base: dict, override: dict) -> dict:
    out = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def _validate(merged: dict, leaf: YamlDoc, where: dict) -> Profile:
    if "name" in merged:
        file, line = where.get("name", (leaf.display, None))
        raise ProfileError([problem(file, "name", "not allowed: a profile is named by its file", line)])
    try:
        profile = Profile.model_validate({**merged, "name": leaf.path.stem})
    except ValidationError as exc:
        raise ProfileError([schema_problem(err, Profile, leaf.display, where) for err in exc.errors()]) from None
    found = contradictions(profile)
    if found:
        raise ProfileError([located(key, reason, leaf.display, where) for key, reason in found])
    return profile
