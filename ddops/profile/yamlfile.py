"""Read a YAML file into plain data plus the line of every key, for error messages.

The one reader of every file ddops is handed (profiles, the inventory, rollout plans, prompt
files). Errors are one-line problems, `<file>: <key.path> (line N): <reason>`, raised together
as a ConfigError subclass. Files are bounded before they cost anything: size, UTF-8, nesting
depth, alias count and the size with aliases expanded (a 500-byte alias bomb expands to
billions of nodes), and integer length.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from ddops import exits

MAX_BYTES = 1 << 20          # profiles, inventories and plans are a few KB; prompt sets < 1 MB
MAX_DEPTH = 64               # nesting of mappings and sequences
MAX_ALIASES = 100            # `*name` references in one document
MAX_NODES = 100_000          # nodes with every alias expanded
MAX_INT_DIGITS = 40          # beyond any count, size or seed ddops reads

KeyPath = tuple  # ("memory", "context_length") or ("smoke", "messages", 0, "role")


class ConfigError(exits.BadInput):
    """Bad configuration; `.problems` holds one line per problem."""

    hint = ("fix the lines above, then `ddops validate`; `ddops show PROFILE` prints what a "
            "profile resolves to")

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


def read_text(path: Path) -> tuple[str | None, list[str]]:
    """The file as text, or a problem: unreadable, too large, or not UTF-8."""
    shown = display_path(path)
    try:
        with open(path, "rb") as handle:
            raw = handle.read(MAX_BYTES + 1)
    except OSError as exc:
        return None, [problem(shown, None, f"cannot read: {exc.strerror or exc}")]
    if len(raw) > MAX_BYTES:
        return None, [problem(shown, None, f"larger than {MAX_BYTES >> 20} MiB: refused unread")]
    try:
        return raw.decode("utf-8-sig"), []
    except UnicodeDecodeError as exc:
        return None, [problem(shown, None, f"not UTF-8 text (byte 0x{raw[exc.start]:02x} at offset {exc.start})")]


class BoundedLoader(yaml.SafeLoader):
    """SafeLoader that refuses deep nesting, many aliases and long integers while composing."""

    def __init__(self, stream: str):
        super().__init__(stream)
        self.depth, self.aliases = 0, 0

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            self.aliases += 1
            if self.aliases > MAX_ALIASES:
                raise LimitError(f"more than {MAX_ALIASES} aliases", self.peek_event().start_mark)
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise LimitError(f"nested deeper than {MAX_DEPTH} levels", self.peek_event().start_mark)
        try:
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1

    def construct_yaml_int(self, node):
        if sum(ch.isdigit() for ch in node.value) > MAX_INT_DIGITS:
            raise LimitError(f"an integer longer than {MAX_INT_DIGITS} digits", node.start_mark)
        return super().construct_yaml_int(node)


BoundedLoader.add_constructor("tag:yaml.org,2002:int", BoundedLoader.construct_yaml_int)


class LimitError(yaml.MarkedYAMLError):
    def __init__(self, reason: str, mark):
        super().__init__(problem=reason, problem_mark=mark)


def expanded_size(node: yaml.Node, limit: int) -> int:
    """Nodes in the document with aliases expanded, counted without expanding them (a node
    reached twice counts twice); stops early past `limit`."""
    sizes: dict[int, int] = {}

    def size(item: yaml.Node) -> int:
        if id(item) not in sizes:
            children = item.value if isinstance(item, yaml.SequenceNode) else \
                [part for pair in item.value for part in pair] if isinstance(item, yaml.MappingNode) else []
            sizes[id(item)] = min(limit + 1, 1 + sum(size(child) for child in children))
        return sizes[id(item)]

    return size(node)


def load_data(path: Path) -> tuple[object, yaml.Node | None, list[str]]:
    """(data, root node, problems) of a bounded YAML (or JSON) file; data only without problems."""
    shown = display_path(path)
    text, problems = read_text(path)
    if problems:
        return None, None, problems
    loader = None
    try:
        loader = BoundedLoader(text)   # the reader refuses unprintable characters right here
        node = loader.get_single_node()
        if node is not None and expanded_size(node, MAX_NODES) > MAX_NODES:
            return None, None, [problem(shown, None, f"expands to more than {MAX_NODES} nodes "
                                                     "through its aliases: refused")]
        data = loader.construct_document(node) if node is not None else None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        reason = f"{'refused' if isinstance(exc, LimitError) else 'bad YAML'}: {exc.problem or exc.context}"
        return None, None, [problem(shown, None, reason, mark.line + 1 if mark else None)]
    except yaml.YAMLError as exc:
        return None, None, [problem(shown, None, f"bad YAML: {str(exc).splitlines()[0]}")]
    finally:
        if loader is not None:
            loader.dispose()
    return data, node, []


def read_yaml(path: Path) -> tuple[YamlDoc | None, list[str]]:
    """Parse one file; returns (doc, problems). A doc is returned only when problems is empty."""
    data, node, problems = load_data(path)
    if problems:
        return None, problems
    lines: dict[KeyPath, int] = {}
    duplicates: list[str] = []
    if node is not None:
        _index(node, (), lines, duplicates, display_path(path))
    return (YamlDoc(path, data, lines) if not duplicates else None), duplicates


def _index(node: yaml.Node, path: KeyPath, lines: dict, duplicates: list, shown: str) -> None:
    if isinstance(node, yaml.MappingNode):
        seen: set[str] = set()
        for key_node, value_node in node.value:
            if not isinstance(key_node, yaml.ScalarNode):
                duplicates.append(problem(shown, dotted(path) or None, "a key must be a plain value",
                                          key_node.start_mark.line + 1))
                continue
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
