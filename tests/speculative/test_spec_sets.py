"""The per-prompt-set benchmark end to end on a tiny pair: one ratio per method and set, every
output equal to plain's (figures are printed, never asserted on speed)."""

import json
import subprocess
import sys

from serving.bench.__main__ import load_prompts
from serving.tools.drafter.prompts import training_prompts


def test_unseen_prompts_are_none_of_the_drafters_training_prompts():
    unseen = load_prompts("unseen", 0)
    assert len(unseen) >= 12 and len(set(unseen)) == len(unseen)
    assert not set(unseen) & set(training_prompts(100_000))


def test_sets_bench_prints_ratios_per_set_in_one_run(tiny_dirs, distilled_drafts, tmp_path):
    out = tmp_path / "sets.json"
    cmd = [sys.executable, "-m", "serving.bench.spec_sets", "--model", str(tiny_dirs["llama"]),
           "--draft", str(distilled_drafts["llama"]), "--sets", "default,unseen",
           "--methods", "none,dflash,ddtree:8+adaptive", "--max-tokens", "10", "--limit", "1", "--json", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    results = json.loads(out.read_text())["results"]
    assert [(r["set"], r["method"]) for r in results] == [
        (s, m) for s in ("default", "unseen") for m in ("none", "dflash", "ddtree:8+adaptive")]
    assert all(r["equal_to_none"] for r in results)
    assert all(r["ratio"] == 1.0 for r in results if r["method"] == "none")
    assert "load average" in done.stdout and "unseen" in done.stdout

