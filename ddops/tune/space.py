"""The search space of `ddops tune`: which profile keys to vary, and the candidates they make.

The default space is the runtime table's own (`Flag.tune`, ddops/profile/runtimes.py): nothing
here names a runtime or a method. A space file narrows or extends it:

    speculative.ddtree_budget: [8, 16]      # these values instead of the table's
    memory.max_running_requests: [4]        # one value: fixed, not searched
    speculative.adaptive: []                # not searched (the base profile's value stays)

A candidate is the base profile plus overrides. A key whose method capability (`Flag.applies`)
the candidate's method lacks is left unset, so DDTree:16 with a chain verifier is not a
candidate of its own: it is the chain, counted once.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass
from pathlib import Path

from ddops.profile.methods import METHODS, method_key
from ddops.profile.runtimes import RUNTIMES, Flag
from ddops.profile.schema import value_at
from ddops.profile.yamlfile import ConfigError, problem, read_yaml

METHOD_KEY = "speculative.algorithm"


class SpaceError(ConfigError):
    """A space file that cannot be used: file, key and reason."""


@dataclass(frozen=True)
class Space:
    """Key -> the values tried, in the order given (the method first when it is searched)."""
    keys: dict[str, tuple]

    def to_dict(self) -> dict:
        return {k: list(v) for k, v in self.keys.items()}


def _flags(runtime_name: str) -> dict[str, Flag]:
    """The runtime's flags by key (a key with several flags, e.g. vLLM's mirror: the first)."""
    found: dict[str, Flag] = {}
    for flag in RUNTIMES[runtime_name].flags:
        found.setdefault(flag.key, flag)
    return found


def default_space(profile) -> Space:
    """The runtime table's tunable keys; the method is searched only among methods this
    profile can draft for (a profile without a draft model tries plain decoding only)."""
    keys = {}
    for key, flag in _flags(profile.runtime).items():
        if flag.tune:
            keys[key] = flag.tune
    if METHOD_KEY in keys and profile.speculative.draft_model_path is None:
        keys[METHOD_KEY] = tuple(m for m in keys[METHOD_KEY] if not METHODS[method_key(m)].needs_draft)
    return Space(_method_first(keys))


def load_space(path: Path | None, profile) -> Space:
    """The default space with the file's keys replacing (or adding to) it."""
    space = default_space(profile)
    if path is None:
        return space
    doc, problems = read_yaml(Path(path))
    if problems:
        raise SpaceError(problems)
    if not isinstance(doc.data, dict):
        raise SpaceError([problem(doc.display, None, "must be a mapping of profile key -> list of values")])
    flags, keys, found = _flags(profile.runtime), dict(space.keys), []
    for key, values in doc.data.items():
        line = doc.lines.get((key,))
        if key not in flags:
            tunable = ", ".join(k for k, f in flags.items() if f.flag and f.style != "unit")
            found.append(problem(doc.display, key, f"runtime {profile.runtime} has no flag for this key "
                                                   f"(keys it has: {tunable})", line))
        elif not isinstance(values, list) or any(isinstance(v, (dict, list)) for v in values):
            found.append(problem(doc.display, key, "must be a list of values", line))
        elif values:
            keys[key] = tuple(dict.fromkeys(values))
        else:
            keys.pop(key, None)
    if found:
        raise SpaceError(found)
    return Space(_method_first(keys))


def _method_first(keys: dict) -> dict:
    """The method decides which other keys apply, so it is chosen first."""
    return {**({METHOD_KEY: keys[METHOD_KEY]} if METHOD_KEY in keys else {}),
            **{k: v for k, v in keys.items() if k != METHOD_KEY}}


def method_of(overrides: dict, profile):
    """The Method a candidate runs: its override, else the base profile's."""
    return METHODS[method_key(overrides.get(METHOD_KEY, profile.speculative.algorithm))]


def applies(key: str, method, runtime_name: str) -> bool:
    """Whether `key` means anything for `method` (its Flag.applies capability)."""
    flag = _flags(runtime_name).get(key)
    return flag is None or flag.applies is None or bool(getattr(method, flag.applies))


def effective(overrides: dict, profile) -> dict:
    """The overrides a candidate really sets: a key its method cannot use is unset (None) where
    the base profile sets it, and dropped where the base leaves it unset."""
    method = method_of(overrides, profile)
    out = {}
    for key in [*overrides, *_flags(profile.runtime)]:
        if key in out:
            continue
        if applies(key, method, profile.runtime):
            if key in overrides:
                out[key] = overrides[key]
        elif _base_value(profile, key) is not None:
            out[key] = None
    return out


def _base_value(profile, key: str):
    try:
        return value_at(profile, key)
    except AttributeError:
        return None


def candidates(space: Space, profile) -> list[dict]:
    """Every distinct candidate of the space (effective overrides), in grid order."""
    seen, out = set(), []
    for values in itertools.product(*space.keys.values()):
        chosen = effective(dict(zip(space.keys, values)), profile)
        key = candidate_id(chosen)
        if key not in seen:
            seen.add(key)
            out.append(chosen)
    return out


def candidate_id(overrides: dict) -> str:
    """A stable name of a candidate's overrides (the study's grid value and its dedupe key)."""
    return json.dumps(overrides, sort_keys=True)


def nested(overrides: dict) -> dict:
    """{"a.b": v} -> {"a": {"b": v}}: the shape a profile file writes."""
    out: dict = {}
    for key, value in overrides.items():
        node = out
        *path, last = key.split(".")
        for part in path:
            node = node.setdefault(part, {})
        node[last] = value
    return out


def label(overrides: dict) -> str:
    """One short line: `ddtree budget=16 adaptive=off running=8`."""
    if not overrides:
        return "as the base profile"
    parts = []
    for key, value in overrides.items():
        section, name = key.rsplit(".", 1)
        name = key if name == "enabled" else name        # cuda_graph.enabled: the section says what
        parts.append(f"{name}={'unset' if value is None else value}")
    return " ".join(parts)
