"""Every repository path the docs, comments and docstrings cite exists, and nothing cites a file
outside the repository: a reader can follow each reference (docs/references.md holds the public
sources of facts from other projects). Whole files are read, code included: a path in code
that names a repository file must exist too."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SCANNED = ("ddops", "serving", "tests", "docs", "templates", "profiles", "plans", "README.md", "Makefile")
TEXT = {".py", ".md", ".yaml", ".yml", ".j2", ".json", ".txt", ".toml", ".jinja", ".sh", ".service", ""}
SKIPPED = {"__pycache__", "data", "journals", "golden"}  # generated tables and recorded output, not prose
# a path-like token: words joined by slashes, not inside a URL, an absolute path or a dotted name
PATH = re.compile(r"(?<![\w./:@~$-])((?:[A-Za-z_][\w.-]*/)+[\w.*-]*)")
OUTSIDE = re.compile("(?<![\\w.-])re" "search/|STYLE\\.md|(?<![\\w.])/wo" "rk/")
TOPS = {p.name for p in REPO.iterdir() if not p.name.startswith(".") and p.name != "ddops.egg-info"}


def scanned_files() -> list[Path]:
    files = []
    for name in SCANNED:
        root = REPO / name
        for f in [root] if root.is_file() else root.rglob("*"):
            if f.is_file() and f.suffix in TEXT and not SKIPPED & set(f.relative_to(REPO).parts) \
                    and f != Path(__file__).resolve():  # its own examples of bad references
                files.append(f)
    return files


def exists(cited: str) -> bool:
    """A cited path exists; `*` and upper-case placeholders (NAME, VERSION) match any name."""
    parts = [re.sub(r"(?<![A-Za-z])[A-Z][A-Z_]+(?![a-z])", "*", part) for part in cited.rstrip("/.").split("/")]
    pattern = "/".join(parts)
    return any(REPO.glob(pattern)) if "*" in pattern else (REPO / pattern).exists()


def cited_paths(text: str) -> list[str]:
    return [m.group(1).rstrip(".,;:") for m in PATH.finditer(text) if m.group(1).split("/")[0] in TOPS]


def test_every_cited_repository_path_exists():
    dangling = sorted(f"{f.relative_to(REPO)}: {cited}" for f in scanned_files()
                      for cited in cited_paths(f.read_text(errors="replace")) if not exists(cited))
    assert dangling == []


def test_nothing_cites_a_file_outside_the_repository():
    outside = sorted(f"{f.relative_to(REPO)}:{n + 1}: {line.strip()[:80]}" for f in scanned_files()
                     for n, line in enumerate(f.read_text(errors="replace").splitlines()) if OUTSIDE.search(line))
    assert outside == []


def test_the_scan_finds_a_dangling_path_and_an_outside_one():
    text = "see ddops/fit/memory.py and ddops/fit/nowhere.py, not https://example.org/ddops/x.py or /var/lib/ddops/m"
    assert cited_paths(text) == ["ddops/fit/memory.py", "ddops/fit/nowhere.py"]
    assert [exists(p) for p in cited_paths(text)] == [True, False]
    assert exists("profiles/NAME.yaml") and exists("ddops/data/vllm-VERSION.json") and not exists("docs/NOPE.txt")
    assert OUTSIDE.search("notes in re" "search/deploy.md") and not OUTSIDE.search("our research, in docs/")
    assert SECTION.findall('(docs/spec.md, section "Round loop")') == [("docs/spec.md", "Round loop")]


SECTION = re.compile(r'(docs/[\w.-]+\.md),? (?:section )?"([^"]+)"')


def test_every_cited_section_of_a_doc_is_one_of_its_headings():
    """`docs/X.md, section "Title"` (or `docs/X.md "Title"`) names a heading of that page, or the
    start of one; a title may wrap over comment lines."""
    missing = []
    for f in scanned_files():
        for page, wrapped in SECTION.findall(f.read_text(errors="replace")):
            title = re.sub(r"\s*\n\s*#?\s*", " ", wrapped)
            headings = [line.lstrip("#").strip() for line in (REPO / page).read_text().splitlines()
                        if line.startswith("#")] if (REPO / page).is_file() else []
            if not any(h.startswith(title) for h in headings):
                missing.append(f"{f.relative_to(REPO)}: {page} \"{title}\"")
    assert sorted(missing) == []
