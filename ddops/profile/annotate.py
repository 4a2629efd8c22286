"""A resolved profile as YAML, each value annotated with where it came from."""

from __future__ import annotations

import yaml

from ddops.profile.schema import Profile

COMMENT_COLUMN_MAX = 64


def annotated_yaml(profile: Profile) -> str:
    """`key: value  # file` lines; a file of the extends chain, `default`, or `file name`."""
    rows = list(_rows(profile.model_dump(mode="json"), profile, "", 0))
    width = min(COMMENT_COLUMN_MAX, max((len(text) for text, _ in rows if _ is not None), default=0))
    out = []
    for text, source in rows:
        out.append(text if source is None else f"{text.ljust(width)}  # {source}")
    return "\n".join(out) + "\n"


def sources(profile: Profile) -> dict[str, str]:
    """Dotted key of every leaf value -> where it came from."""
    return {key: source for key, source in _leaves(profile.model_dump(mode="json"), profile, "")}


def _rows(data: dict, profile: Profile, prefix: str, depth: int):
    pad = "  " * depth
    for key, value in data.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            yield f"{pad}{key}:", None
            yield from _rows(value, profile, f"{path}.", depth + 1)
        else:
            yield f"{pad}{key}: {_scalar(value)}", _source(profile, path)


def _leaves(data: dict, profile: Profile, prefix: str):
    for key, value in data.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            yield from _leaves(value, profile, f"{path}.")
        else:
            yield path, _source(profile, path)


def _source(profile: Profile, path: str) -> str:
    if path == "name":
        return "file name"
    if path == "extends":
        return profile.files[0] if profile.files else "default"
    return profile.source_of(path)


def _scalar(value: object) -> str:
    text = yaml.safe_dump(value, default_flow_style=True, width=10_000, sort_keys=False).strip()
    return text.removesuffix("\n...").removesuffix("...").strip()
