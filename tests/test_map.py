"""docs/architecture.md against the code: its ops table's import order (every import of `ddops/`,
lazy ones included, goes to the importer's own row or a row below), no package cycles in `ddops`
or `serving` at any level, the files each table row names exist in that row's folders, rollouts
reach the deploy engine through one module, Rich is imported only where the page says, every
file of `serving` is named in its runtime row, and the opening names every shared contract module."""

from __future__ import annotations

import functools
import re
from pathlib import Path

from tests.test_boundaries import cycles, imported_modules, module_graph, package_of

REPO = Path(__file__).resolve().parent.parent
PAGE = (REPO / "docs/architecture.md").read_text()
TICKED = re.compile(r"`([^`]+)`")


@functools.cache
def ddops_imports() -> dict[str, set[str]]:
    """Repository path of each ddops file -> every module it may import (lazy imports too)."""
    return {str(f.relative_to(REPO)): imported_modules(f.read_text(), package_of(f))
            for f in (REPO / "ddops").rglob("*.py")}


def section(title: str) -> str:
    """The page's text from a `## title` heading to the next `## ` heading."""
    start = PAGE.index(f"## {title}")
    end = PAGE.find("\n## ", start + 1)
    return PAGE[start:end if end >= 0 else len(PAGE)]


def table_rows(text: str) -> list[tuple[list[str], str]]:
    """(the first column's ticked names, the job column) of each row of the section's first table."""
    rows = []
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")] if line.startswith("|") else []
        if len(cells) >= 2 and not set(cells[0]) <= set("-") and TICKED.search(cells[0]):
            rows.append((TICKED.findall(cells[0]), "|".join(cells[1:])))
    return rows


OPS_ROWS = table_rows(section("The ops side"))
SERVING_ROWS = table_rows(section("The runtime"))


def unit_paths(top: str, names: list[str]) -> list[Path]:
    return [REPO / top / name.rstrip("/") for name in names]


def row_of(module: str) -> int | None:
    """Index of the ops row whose folder or module holds `module` (a dotted ddops module name)."""
    path = REPO / Path(*module.split("."))
    for index, (names, _) in enumerate(OPS_ROWS):
        for unit in unit_paths("ddops", names):
            if unit.suffix == ".py" and path.with_suffix(".py") == unit:
                return index
            if unit.name == "__init__.py" and path == unit.parent:
                return index
            if unit.suffix != ".py" and (path == unit or unit in path.parents):
                return index
    return None


def test_every_ddops_module_has_its_row():
    graph = module_graph()
    assert sorted(m for m in graph if m.startswith("ddops") and row_of(m) is None) == []


def test_ddops_imports_go_downwards_in_the_table():
    graph = module_graph()
    upward = sorted(f"{m} (row {row_of(m) + 1}) imports {d} (row {row_of(d) + 1})"
                    for m, deps in graph.items() if m.startswith("ddops")
                    for d in deps if d.startswith("ddops") and row_of(d) < row_of(m))
    assert upward == []


def package_graphs(top: str) -> dict[str, dict[str, set[str]]]:
    """For every package P of `top`: its children (subpackages and modules) -> the children of P
    they import, through any module inside them."""
    graph = module_graph()
    levels: dict[str, dict[str, set[str]]] = {}
    for module, deps in graph.items():
        if not module.startswith(top):
            continue
        for dep in deps:
            a, b = module.split("."), dep.split(".")
            common = 0
            while common < min(len(a), len(b)) and a[common] == b[common]:
                common += 1
            if common == 0 or common >= min(len(a), len(b)):
                continue  # another top, or a package importing its own submodule
            parent = ".".join(a[:common])
            children = levels.setdefault(parent, {})
            children.setdefault(".".join(a[:common + 1]), set()).add(".".join(b[:common + 1]))
            children.setdefault(".".join(b[:common + 1]), set())
    return levels


def package_cycles(top: str) -> list[list[str]]:
    return [c for children in package_graphs(top).values() for c in cycles(children)]


def test_ddops_has_no_package_cycles():
    assert package_cycles("ddops") == []


def test_serving_has_no_package_cycles():
    assert package_cycles("serving") == []


def test_a_package_cycle_through_submodules_is_found():
    """install.sync -> lab.errors and lab.lifecycle -> install.bundled: a cycle of packages
    although no two modules import each other."""
    assert cycles({"ddops.install": {"ddops.lab"}, "ddops.lab": {"ddops.install"}}) == [["ddops.install", "ddops.lab"]]
    rows = package_graphs("ddops")
    assert "ddops.rollout" in rows["ddops"] and "ddops.rollout.shadow" in rows["ddops.rollout"]


def named_files(rows, top: str) -> list[str]:
    """Every ticked `name.py` or `folder/` of a row's job that is in none of its row's folders."""
    missing = []
    for names, job in rows:
        folders = [p for p in unit_paths(top, names) if p.is_dir()] or [REPO / top]
        for name in TICKED.findall(job):
            if "/" in name.rstrip("/") or " " in name or not re.fullmatch(r"[\w.]+\.py|\w+/", name):
                continue  # a repository path (tests/test_references.py), a dotted name or code
            sibling = name.endswith("/") and (REPO / top / name).is_dir()   # another row's folder
            if not sibling and not any(next(folder.rglob(name.rstrip("/")), None) for folder in folders):
                missing.append(f"{', '.join(names)}: {name}")
    return missing


def test_every_file_a_row_names_exists_in_its_folders():
    assert named_files(OPS_ROWS, "ddops") == []
    assert named_files(SERVING_ROWS, "serving") == []


def test_rollout_reaches_the_deploy_engine_only_through_host_changes():
    direct = sorted(f for f, modules in ddops_imports().items()
                    if f.startswith("ddops/rollout/") and not f.endswith("/host_changes.py")
                    and any(m == "ddops.deploy" or m.startswith("ddops.deploy.") for m in modules))
    assert direct == []


def importers_of(top_module: str) -> list[str]:
    return sorted(f for f, modules in ddops_imports().items() if any(m.split(".")[0] == top_module for m in modules))


def test_rich_is_imported_only_where_the_page_says():
    claim = PAGE[PAGE.index("Rich is\nimported only by"):PAGE.index("`tests/test_map.py` checks this list")]
    allowed = [REPO / "ddops" / name.rstrip("/") for name in TICKED.findall(claim) if "/" in name]
    assert all(p.exists() for p in allowed), allowed
    users = [f for f in importers_of("rich") if not any(REPO / f == p or p in (REPO / f).parents for p in allowed)]
    assert users == []


def test_remote_is_the_only_package_that_imports_fabric_and_paramiko():
    """The `remote/` row's claim: the SSH boundary is one package."""
    assert [f for f in importers_of("fabric") + importers_of("paramiko") if not f.startswith("ddops/remote/")] == []


def serving_row_of(path: Path) -> int | None:
    """Index of the runtime row that holds the serving file `path`: its folder's row, or the row
    naming it when it sits at the top of `serving/`."""
    for index, (names, _) in enumerate(SERVING_ROWS):
        for unit in unit_paths("serving", names):
            if path == unit or (unit.is_dir() and unit in path.parents):
                return index
    return None


def serving_files() -> list[Path]:
    return sorted(p for p in (REPO / "serving").rglob("*") if p.suffix in (".py", ".c") and p.name != "__init__.py")


def test_every_serving_file_has_its_row():
    assert [str(p.relative_to(REPO)) for p in serving_files() if serving_row_of(p) is None] == []


def test_every_file_of_the_runtime_is_named_in_its_row():
    """A folder's row names each of its files, so a newcomer finds every job from the page."""
    unnamed = []
    for path in serving_files():
        index = serving_row_of(path)
        names, job = SERVING_ROWS[index] if index is not None else ([], "")
        if path.name not in TICKED.findall(job) and path.name not in names:
            unnamed.append(str(path.relative_to(REPO)))
    assert unnamed == []


def test_the_opening_names_every_shared_contract_module():
    opening = PAGE[:PAGE.index("\n## ")]
    modules = sorted(p.name for p in (REPO / "serving/contract").glob("*.py") if p.name != "__init__.py")
    assert modules and [m for m in modules if f"`{m}`" not in opening] == []
