"""Read a YAML file into plain data plus the line of every key, for error messages.

Shared by profiles and the inventory. Errors are collected as one-line problems,
`<file>: <key.path> (line N): <reason>`, and raised together as a ConfigError subclass.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import yaml

KeyPath = tuple  # ("memory", "context_length") or ("smoke", "messages", 0, "role")


class ConfigError(Exception):
    """Bad configuration; `.problems` holds one line per problem."""

    def __init__(self, problems: list[str]):
        self.problems = list(problems)
        super().__init__("\n".join(self.problems))


@dataclass(frozen=True)
class YamlDoc:
    path: Path
    data: object
    lines: dict[KeyPath, int] = field(default_factory=dict)  # key path -> 1-based line

    @property
    def display(self) -> str:
        return display_path(self.path)


def display_path(path: Path) -> str:
    """Relative to the working directory when under it, so messages stay short."""
    try:
        return os.path.relpath(path) if path.resolve().is_relative_to(Path.cwd()) else str(path)
    except (OSError, ValueError):
        return str(path)


def dotted(path: KeyPath) -> str:
    return ".".join(str(part) for part in path)


def problem(file: str, key: str | None, reason: str, line: int | None = None) -> str:
    """`<file>: <key.path> (line N): <reason>`, leaving out the parts not known."""
    where = " ".join(part for part in (key, f"(line {line})" if line else None) if part)
    return f"{file}: {where}: {reason}" if where else f"{file}: {reason}"


def read_yaml(path: Path) -> tuple[YamlDoc | None, list[str]]:
    """Parse one file; returns (doc, problems). A doc is returned only when problems is empty."""
    shown = display_path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        return None, [problem(shown, None, f"cannot read: {exc.strerror or exc}")]
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        data = loader.construct_document(node) if node is not None else None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        reason = f"bad YAML: {exc.problem or exc.context}"
        return None, [problem(shown, None, reason, mark.line + 1 if mark else None)]
    except yaml.YAMLError as exc:
        return None, [problem(shown, None, f"bad YAML: {exc}")]
    finally:
        loader.dispose()
    lines: dict[KeyPath, int] = {}
    duplicates: list[str] = []
    if node is not None:
        _index(node, (), lines, duplicates, shown)
    return (YamlDoc(path, data, lines) if not duplicates else None), duplicates


def _index(node: yaml.Node, path: KeyPath, lines: dict, duplicates: list, shown: str) -> None:
    if isinstance(node, yaml.MappingNode):
        seen: set[str] = set()
        for key_node, value_node in node.value:
            key = (*path, key_node.value)
            line = key_node.start_mark.line + 1
            if key_node.value in seen:
                duplicates.append(problem(shown, dotted(key), "duplicate key", line))
            seen.add(key_node.value)
            lines[key] = line
            _index(value_node, key, lines, duplicates, shown)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            key = (*path, index)
            lines[key] = item.start_mark.line + 1
            _index(item, key, lines, duplicates, shown)
