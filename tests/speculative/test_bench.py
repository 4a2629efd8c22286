"""The benchmark command end to end on a tiny pair (figures are printed, never asserted on speed)."""

import json
import subprocess
import sys

import pytest

from serving.bench.spec import parse_methods


def test_method_list_parses_budgets_only_for_tree_methods():
    methods = parse_methods("none, DFLASH ,ddtree:16")
    assert [(m.label, m.spec.name, m.budget) for m in methods] == [
        ("none", "none", None), ("DFLASH", "dflash", None), ("ddtree:16", "ddtree", 16)]
    with pytest.raises(ValueError, match="dflash takes no tree budget"):
        parse_methods("dflash:4")
    adaptive = parse_methods("ddtree:64+adaptive")[0]
    assert (adaptive.budget, adaptive.adaptive) == (64, True)
    assert parse_methods("ddtree:8+full-vocab")[0].draft_vocab is False
    with pytest.raises(ValueError, match="nothing to adapt"):
        parse_methods("none+adaptive")


def test_bench_reports_every_method_against_none(tiny_dirs, distilled_drafts, tmp_path):
    out = tmp_path / "bench.json"
    cmd = [sys.executable, "-m", "serving.bench", "--model", str(tiny_dirs["llama"]),
           "--draft", str(distilled_drafts["llama"]), "--methods", "none,dflash,ddtree:4,ddtree:32,ddtree:32+adaptive",
           "--max-tokens", "24", "--limit", "3", "--repeat", "2", "--threads", "1", "--json", str(out), "--peer"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(out.read_text())
    rows = {m["label"]: m for m in report["methods"]}
    assert list(rows) == ["none", "dflash", "ddtree:4", "ddtree:32", "ddtree:32+adaptive", "dflash package"]
    assert all(m["equal_to_none"] for m in rows.values())  # z-lab's own loop included
    assert [s["setting"] for s in rows["ddtree:32+adaptive"]["settings"]] == \
        ["plain"] + [f"budget {b}" for b in (1, 2, 3, 4, 6, 8, 12, 16, 24, 32)]
    assert rows["none"]["speedup"] == 1.0 and rows["none"]["tau"] == 1.0
    assert report["prompts"] == 3 and report["repeat"] == 2
    assert rows["ddtree:32"]["tau"] > 1.0 and rows["ddtree:32"]["rounds"] > 0
    assert set(rows["ddtree:32"]["ms_per_round"]) == {"draft", "tree", "verify", "accept"}
    assert "ddtree:32" in done.stdout and "tok/s" in done.stdout


def test_bench_rejects_a_missing_draft(tiny_dirs):
    done = subprocess.run([sys.executable, "-m", "serving.bench", "--model", str(tiny_dirs["llama"]),
                           "--methods", "none,ddtree"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "--draft is required" in done.stdout


def test_prompt_sets_are_built_in_or_read_from_a_file(tmp_path):
    from serving.bench.__main__ import load_prompts

    words = load_prompts("random-words", 3)
    assert len(set(words)) == 3 and words == load_prompts("random-words", 3)  # seeded
    assert load_prompts(None, 2) == load_prompts("default", 2)
    (tmp_path / "p.txt").write_text("one\n\ntwo\n")
    assert load_prompts(str(tmp_path / "p.txt"), 0) == ["one", "two"]
    with pytest.raises(OSError):
        load_prompts(str(tmp_path / "missing.txt"), 0)
