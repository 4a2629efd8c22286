"""Every repository path the docs, comments and docstrings cite exists, and nothing cites a file
outside the repository: a reader can follow each reference (docs/references.md holds the public
sources of facts from other projects). Whole files are read, code included: a path in code
that names a repository file must exist too."""

from __future__ import annotations

import fnmatch
import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SCANNED = ("ddops", "serving", "tests", "docs", "templates", "profiles", "plans", "README.md", "Makefile")
TEXT = {".py", ".md", ".yaml", ".yml", ".j2", ".json", ".txt", ".toml", ".jinja", ".sh", ".service", ""}
SKIPPED = {"__pycache__", "data", "journals", "golden"}  # generated tables and recorded output, not prose
# a path-like token: words joined by slashes, not inside a URL, an absolute path or a dotted name
PATH = re.compile(r"(?<![\w./:@~$-])((?:[A-Za-z_][\w.-]*/)+[\w.*-]*)")
OUTSIDE = re.compile("(?<![\\w.-])re" "search/|STYLE\\.md|(?<![\\w.])/wo" "rk/")
# what the repository tracks, not what a run left in the work tree (`make demo` makes lab/, a
# build makes ddops.egg-info/): a citation of an untracked path dangles for every other reader,
# and a new file is scanned once `git add` tracks it
TRACKED = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, text=True,
                         check=True).stdout.strip("\0").split("\0")
FOLDERS = {"/".join(f.split("/")[:n]) for f in TRACKED for n in range(1, f.count("/") + 1)}
TRACKED = set(TRACKED)
TOPS = {f.split("/")[0] for f in TRACKED if not f.startswith(".")}


def scanned_files() -> list[Path]:
    files = []
    for name in SCANNED:
        root = REPO / name
        for f in [root] if root.is_file() else root.rglob("*"):
            name = str(f.relative_to(REPO))
            if name in TRACKED and f.suffix in TEXT and not SKIPPED & set(f.relative_to(REPO).parts) \
                    and f != Path(__file__).resolve():  # its own examples of bad references
                files.append(f)
    return files


def exists(cited: str) -> bool:
    """A cited path exists; `*` and upper-case placeholders (NAME, VERSION) match any name."""
    parts = [re.sub(r"(?<![A-Za-z])[A-Z][A-Z_]+(?![a-z])", "*", part) for part in cited.rstrip("/.").split("/")]
    pattern = "/".join(parts)
    return any(fnmatch.fnmatchcase(f, pattern) for f in TRACKED | FOLDERS) if "*" in pattern else \
        pattern in TRACKED or pattern in FOLDERS


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


def test_a_path_a_run_left_in_the_work_tree_is_not_a_repository_path():
    """`make demo` then `make test`, as the README says: the demo's lab/ folder (untracked) must
    neither make a citation of it valid nor put its files among the scanned ones."""
    left = REPO / "lab" / "access.py"
    made = not left.exists()
    left.parent.mkdir(exist_ok=True)
    left.touch()
    try:
        assert not exists("lab/access.py") and left not in scanned_files()
        assert exists("ddops/lab/inventory_file.py")
    finally:
        if made:
            left.unlink()
            if not any(left.parent.iterdir()):
                left.parent.rmdir()


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
