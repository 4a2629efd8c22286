"""The layering rules of docs/architecture.md, read from the sources' import statements:
`serving` never imports `ddops`; `ddops` imports nothing of `serving` but the stdlib-only
contract package (so an ops host needs no torch, and each shared rule exists once)."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def package_of(path: Path) -> str:
    return ".".join(path.relative_to(REPO).with_suffix("").parts[:-1])


def imported_modules(source: str, package: str) -> set[str]:
    """Absolute module names a source imports (relative imports resolved against its package)."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parent + ([base] if base else []))
            found |= {base} | {f"{base}.{alias.name}" for alias in node.names}
    return found


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


def test_the_scan_sees_relative_and_absolute_imports():
    source = "from ..speculative import base\nimport torch\nfrom ddops.remote import connect\nfrom . import x\n"
    found = imported_modules(source, "serving.contract")
    assert {"serving.speculative.base", "torch", "ddops.remote", "serving.contract.x"} <= found
