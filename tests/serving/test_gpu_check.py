"""The prepared GPU check's own plumbing, on this CPU (`--quick`: a tiny model, two levels).

On a lent GPU machine `make gpu-check` runs the same steps at SmolLM2's shapes in bf16; this
keeps the command from rotting between the rare runs where a machine is lent."""

from __future__ import annotations

import json

from serving.bench import gpu_check


def test_quick_run_writes_every_step_and_checks_lossless(tmp_path, monkeypatch):
    monkeypatch.delenv("DDOPS_API_KEY", raising=False)     # the bench's servers are unkeyed, as on the GPU machine
    out = tmp_path / "gpu-check.json"
    assert gpu_check.main(["--quick", "--device", "cpu", "--out", str(out), "--port", "31460"]) == 0
    report = json.loads(out.read_text())
    steps = report["steps"]
    assert report["facts"]["device"] == "cpu"
    for method in gpu_check.METHODS:
        levels = steps[method]["levels"]
        assert [row["concurrency"] for row in levels] == [1, 2]
        assert all(row["errors"] == 0 and row["output_tokens"] == 2 * row["concurrency"] * 8 for row in levels)
        assert len(steps[method]["answers"]) == 4 and all(steps[method]["answers"])
    assert steps["lossless"] == {"prompts": 4, "equal": True}
    assert set(steps["ratios"]) == {"ddtree_over_plain_tok_s_at_1", "ddtree_over_plain_tok_s_at_2"}
    assert steps["hybrid_parity"] == {"status": "skipped", "reason": "no CUDA device"}


def test_a_lossy_tree_fails_the_check():
    plain = {"levels": [{"errors": 0}], "answers": ["a", "b"]}
    report = {"steps": {"plain": plain, "ddtree:16": {**plain, "answers": ["a", "c"]},
                        "lossless": {"prompts": 2, "equal": False}, "hybrid_parity": {"status": "skipped"}}}
    assert not gpu_check.passed(report)
    report["steps"]["lossless"]["equal"] = True
    assert gpu_check.passed(report)
    report["steps"]["hybrid_parity"]["status"] = "failed"
    assert not gpu_check.passed(report)
