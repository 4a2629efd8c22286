"""The prompt set a shadow comparison replays: a shipped default or a user's YAML/JSON file."""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import yaml

from ddops import exits
from ddops.profile.yamlfile import load_data, read_text

DEFAULT_SET = "shadow_prompts.yaml"


class PromptFileError(exits.BadInput, ValueError):
    """One line naming the file, the entry and the reason."""


@dataclass(frozen=True)
class Prompt:
    id: str
    text: str


def load_prompts(path: Path | None = None) -> tuple[Prompt, ...]:
    """Prompts from `path` (YAML list, JSON list or JSON lines), or the shipped default set."""
    if path is None:
        text = resources.files("ddops.data").joinpath(DEFAULT_SET).read_text()
        return parse_prompts(yaml.safe_load(text), DEFAULT_SET)
    if str(path).endswith(".jsonl"):
        return parse_prompts(_json_lines(Path(path)), str(path))
    data, _, problems = load_data(Path(path))   # YAML is a superset of JSON; bounded reader
    if problems:
        raise PromptFileError(problems[0])
    return parse_prompts(data, str(path))


def _json_lines(path: Path) -> list:
    text, problems = read_text(path)
    if problems:
        raise PromptFileError(problems[0])
    entries = []
    for number, line in enumerate(text.splitlines(), 1):
        try:
            entries += [json.loads(line)] if line.strip() else []
        except (ValueError, RecursionError) as exc:   # JSONDecodeError, an over-long integer
            reason = exc.msg if isinstance(exc, json.JSONDecodeError) else \
                "nested too deep" if isinstance(exc, RecursionError) else str(exc).split(";")[0]
            raise PromptFileError(f"{path}: line {number}: not JSON ({reason})") from None
    return entries


def parse_prompts(data: object, source: str) -> tuple[Prompt, ...]:
    """Entries are strings or {id, prompt} mappings; ids default to the position and must be unique."""
    if not isinstance(data, list) or not data:
        raise PromptFileError(f"{source}: expected a non-empty list of prompts")
    prompts = tuple(_entry(item, index, source) for index, item in enumerate(data))
    seen: set[str] = set()
    for prompt in prompts:
        if prompt.id in seen:
            raise PromptFileError(f"{source}: id {prompt.id!r}: duplicate id")
        seen.add(prompt.id)
    return prompts


def _entry(item: object, index: int, source: str) -> Prompt:
    where = f"{source}: entry {index}"
    if isinstance(item, str):
        item = {"prompt": item}
    if not isinstance(item, dict):
        raise PromptFileError(f"{where}: expected a string or a mapping with 'prompt'")
    unknown = set(item) - {"id", "prompt"}
    if unknown:
        raise PromptFileError(f"{where}: unknown key {sorted(unknown)[0]!r}")
    text = item.get("prompt")
    if not isinstance(text, str) or not text.strip():
        raise PromptFileError(f"{where}: 'prompt' must be a non-empty string")
    return Prompt(id=str(item.get("id", f"p{index}")), text=text)
