"""The host's SGLang version (package metadata, read by the unit's interpreter) against the
profile's rendered flags."""

from __future__ import annotations

import subprocess
import sys

import pytest

from ddops.fit.runtime_version import PROBE, check_flags, parse_probe
from ddops.profile import load_profile
from tests.ops.helpers import SHIPPED, write


def installed(tmp_path, version: str | None, files: list[str]) -> str | None:
    """Run the real probe against a site directory holding an installed sglang's metadata."""
    if version:
        info = tmp_path / f"sglang-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: sglang\nVersion: {version}\n")
        (info / "RECORD").write_text("".join(f"{f},,\n" for f in files))
    proc = subprocess.run([sys.executable, "-S", "-c", f"import sys; sys.path.insert(0, {str(tmp_path)!r})\n" + PROBE],
                          capture_output=True, text=True, check=True)
    return parse_probe(proc.stdout)


def test_probe_reads_the_installed_version(tmp_path):
    assert installed(tmp_path, "0.5.23", ["sglang/srt/server_args.py"]) == "0.5.23"


def test_probe_recognises_a_build_with_the_ddtree_pull_request(tmp_path):
    assert installed(tmp_path, "0.5.23", ["sglang/srt/speculative/ddtree_worker.py"]) == "0.5.23+ddtree"


def test_probe_without_sglang_says_so(tmp_path):
    assert installed(tmp_path, None, []) is None


def test_a_ddtree_profile_on_a_release_without_it_is_a_problem():
    check = check_flags(load_profile("a6000-base", SHIPPED), "0.5.15")
    assert any("no --speculative-algorithm DDTREE" in p for p in check.problems)
    assert any("--speculative-ddtree-budget is not in SGLang 0.5.15" in p for p in check.problems)
    assert "profile declares sglang_version 0.5.23+ddtree, the host runs 0.5.15" in check.notes


def test_the_declared_build_on_the_host_has_every_flag():
    check = check_flags(load_profile("a6000-balanced", SHIPPED), "0.5.23+ddtree")
    assert check.problems == () and not [n for n in check.notes if "declares" in n]


def test_an_undeclared_profile_names_the_removed_flags_and_their_replacements(tmp_path):
    write(tmp_path, "old", """\
        runtime: sglang
        model: {path: /m/q, served_name: q}
        cuda_graph: {max_bs: 8}
        mamba: {scheduler_strategy: extra_buffer}
        """)
    check = check_flags(load_profile("old", tmp_path), "0.5.23")
    assert set(check.problems) == {
        "--cuda-graph-max-bs was removed in SGLang 0.5.23; use --cuda-graph-max-bs-decode",
        "--mamba-scheduler-strategy was removed in SGLang 0.5.23; use --mamba-radix-cache-strategy"}


def test_missing_sglang_is_a_problem_and_the_bundled_runtime_is_not_checked():
    assert check_flags(load_profile("a6000-base", SHIPPED), None).problems
    assert check_flags(load_profile("cpu-ar", SHIPPED), "0.5.23") is None


@pytest.mark.parametrize("stdout,expected", [("0.5.15\nFalse\n", "0.5.15"), ("absent\n", None), ("", None),
                                             ("0.5.23+ddtree\nTrue\n", "0.5.23+ddtree")])
def test_parse_probe(stdout, expected):
    assert parse_probe(stdout) == expected
