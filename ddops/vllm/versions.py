"""vLLM releases ddops knows, one parser-facts file each (ddops/data/vllm-VERSION.json, written by
`python -m ddops.vllm.table --python VLLM_PYTHON` from the released wheel's own parser).

A profile with `vllm_version` is checked against that release; without one, against the newest
tabulated release, which is also what the shipped profiles target. A version string the table
cannot place is refused, naming the versions it knows. Nothing here compares a method's name
outside data: `methods` is the release's own list.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path

from ddops.vllm.parser_facts import ParserFacts, parse

DATA = Path(__file__).resolve().parent.parent / "data"
VERSION = re.compile(r"^(\d+)\.(\d+)\.(\d+)(?:\.post\d+)?(?:\+[A-Za-z0-9.]+)?$")


class VersionError(ValueError):
    pass


def known_versions() -> list[str]:
    """Tabulated releases, oldest first."""
    found = [p.name.removeprefix("vllm-").removesuffix(".json") for p in DATA.glob("vllm-*.json")]
    return sorted(found, key=lambda v: tuple(int(x) for x in VERSION.match(v).groups()[:3]))


@functools.lru_cache(maxsize=8)
def _facts_file(version: str) -> ParserFacts:
    return parse((DATA / f"vllm-{version}.json").read_text(encoding="utf-8"))


def facts_for(version: str | None) -> ParserFacts:
    """The parser facts of `version` (a local label like `+cpu` is ignored), or of the newest
    tabulated release when None."""
    known = known_versions()
    if version is None:
        return _facts_file(known[-1])
    match = VERSION.match(version)
    if not match:
        raise VersionError(f"{version!r} is not a vLLM version (X.Y.Z)")
    base = ".".join(match.groups()[:3])
    if base not in known:
        raise VersionError(f"vLLM {version} is not in ddops's table (it knows {', '.join(known)})")
    return _facts_file(base)


def unknown_flags(facts: ParserFacts, flags: list[str]) -> list[str]:
    """One line per flag the release's parser does not define."""
    return [f"{flag} is not a vLLM {facts.version} flag" for flag in flags if flag not in facts.flags]


def bad_choice(facts: ParserFacts, flag: str, value: str) -> str | None:
    """Why `value` is not one of `flag`'s choices in this release, or None."""
    choices = facts.choices(flag)
    if choices is None or value in choices:
        return None
    return f"vLLM {facts.version} {flag} accepts {', '.join(choices)}; not {value!r}"
