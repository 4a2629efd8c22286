"""The layering rules of docs/architecture.md, read from the sources' import statements:
`serving` never imports `ddops`; `ddops` imports nothing of `serving` but the stdlib-only
contract package (so an ops host needs no torch, and each shared rule exists once); no two
project modules import each other, directly or around a loop; no function over 60 lines."""

from __future__ import annotations

import ast
import functools
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def package_of(path: Path) -> str:
    return ".".join(path.relative_to(REPO).with_suffix("").parts[:-1])


def imports(source: str, package: str) -> list[tuple[str, list[str]]]:
    """(module, names taken from it) for every import statement, at any depth (lazy imports too);
    relative imports resolved against the file's package."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(alias.name, []) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parent + ([base] if base else []))
            found.append((base, [alias.name for alias in node.names]))
    return found


def imported_modules(source: str, package: str) -> set[str]:
    """Every module name a source may import: the module and, for `from M import x`, M.x too."""
    return {m for base, names in imports(source, package) for m in [base, *(f"{base}.{n}" for n in names)]}


def offenders(folder: str, allowed) -> list[str]:
    return sorted(f"{f.relative_to(REPO)}: {m}" for f in (REPO / folder).rglob("*.py")
                  for m in imported_modules(f.read_text(), package_of(f)) if not allowed(m))


def test_serving_never_imports_ddops():
    assert offenders("serving", lambda m: m.split(".")[0] != "ddops") == []


def test_ddops_imports_only_the_contract_of_serving():
    def allowed(module: str) -> bool:
        return module.split(".")[0] != "serving" or module == "serving" or module.startswith("serving.contract")
    assert offenders("ddops", allowed) == []


def test_the_contract_needs_only_the_standard_library():
    def allowed(module: str) -> bool:
        top = module.split(".")[0]
        return top in sys.stdlib_module_names or module == "serving" or module.startswith("serving.contract")
    assert offenders("serving/contract", allowed) == []


@functools.cache  # read once per session: tests/test_map.py reads it too
def module_graph() -> dict[str, set[str]]:
    """Project module -> project modules it imports. `from pkg import submodule` depends on the
    submodule, not on the package's __init__."""
    files = {}
    for top in ("ddops", "serving"):
        for f in (REPO / top).rglob("*.py"):
            parts = f.relative_to(REPO).with_suffix("").parts
            files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = f

    def known(name: str) -> str | None:
        while name and name not in files:
            name = name.rpartition(".")[0]
        return name or None

    graph = {}
    for name, f in files.items():
        deps = set()
        for base, names in imports(f.read_text(), package_of(f)):
            subs = {f"{base}.{n}" for n in names if f"{base}.{n}" in files}
            deps |= subs if subs and len(subs) == len(names) else subs | {known(base)}
        graph[name] = {d for d in deps if d and d != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative enough here)."""
    index, low, stack, on, found, counter = {}, {}, [], set(), [], [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while not component or component[-1] != v:
                component.append(stack.pop())
                on.discard(component[-1])
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycles():
    assert cycles(module_graph()) == []


def test_the_cycle_finder_finds_one():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_the_scan_sees_relative_and_absolute_imports():
    source = "from ..speculative import base\nimport torch\nfrom ddops.remote import connect\nfrom . import x\n"
    found = imported_modules(source, "serving.contract")
    assert {"serving.speculative.base", "torch", "ddops.remote", "serving.contract.x"} <= found


def test_no_function_is_longer_than_60_lines():
    """Short functions named after the domain: a long one is a job to split."""
    long = [f"{f.relative_to(REPO)}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1} lines)"
            for top in ("ddops", "serving") for f in (REPO / top).rglob("*.py")
            for node in ast.walk(ast.parse(f.read_text()))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno >= 60]
    assert long == []
