"""DFlash and DDTree on a hybrid target are lossless: the recurrent state follows the accepted path.

Greedy: through the real engine, speculative output equals plain greedy token for token on the
tiny Qwen3.5-layout hybrid, with random and distilled drafts, over many prompts, lengths,
stop rules, block sizes and tree budgets. Sampling: the chi-square test of
tests/speculative/test_sampling.py on a 5-token hybrid.
"""

import json

import pytest
import torch

from serving.models import inspect_checkpoint, load_model
from serving.models.tokenizer import Tokenizer
from serving.speculative.base import Method
from serving.speculative.chain import ChainVerifier
from serving.speculative.ddtree import TreeVerifier
from serving.engine.batch import BatchRunner
from serving.speculative import lane as lane_module
from serving.speculative.dflash import DFlashDrafter
from serving.tools.tiny import save_weights, write_tiny
from serving.tools.tiny_draft import draft_config, random_model, write_tiny_draft
from serving.tools.tiny_hybrid import hybrid_config, hybrid_weights
from tests.speculative import test_sampling as sampling
from tests.speculative.conftest import DRAFT_TOOLS as SPEC_DRAFT_TOOLS, cached_distilled_draft
from tests.speculative.test_lossless import GREEDY, cases, engine_for

DRAFT_TOOLS = (*SPEC_DRAFT_TOOLS, "serving/tools/tiny_hybrid.py")
# (draft, method, block size, budget): every shape with the distilled draft (real acceptance),
# a chain and a tree with the random one (rejections at every depth)
SETTINGS = [("distilled", "dflash", None, None), ("distilled", "dflash", 3, None),
            ("distilled", "ddtree", None, None), ("distilled", "ddtree", None, 4),
            ("distilled", "ddtree", None, 40), ("random", "dflash", None, None), ("random", "ddtree", None, 16)]


@pytest.fixture(scope="module")
def hybrid_dir(tmp_path_factory):
    return write_tiny(tmp_path_factory.mktemp("hybrid") / "qwen3_5", "qwen3_5")


@pytest.fixture(scope="module")
def drafts(hybrid_dir, tmp_path_factory, cache_dir):
    """random: a seeded draft (low acceptance); distilled: trained on the target's text (cached)."""
    distilled = cached_distilled_draft(hybrid_dir, cache_dir, "qwen3_5", DRAFT_TOOLS)
    return {"random": write_tiny_draft(hybrid_dir, tmp_path_factory.mktemp("hdraft") / "random", seed=1),
            "distilled": distilled}


@pytest.fixture(scope="module")
def plain_runs(hybrid_dir):
    target = load_model(inspect_checkpoint(hybrid_dir), torch.float32, "cpu", 1024)
    tokenizer = Tokenizer.from_dir(hybrid_dir)
    plain = engine_for("none", target, tokenizer, None)
    runs = [(prompt, rule, plain.generate(prompt, GREEDY, rule)) for prompt, rule in cases(plain, tokenizer)]
    plain.stop()
    return target, tokenizer, runs


@pytest.mark.parametrize("kind, name, block, budget", SETTINGS)
def test_greedy_speculative_equals_plain_on_a_hybrid(plain_runs, drafts, kind, name, block, budget):
    target, tokenizer, runs = plain_runs
    engine = engine_for(name, target, tokenizer, drafts[kind], block, budget)
    try:
        for prompt, rule, expected in runs:
            got = engine.generate(prompt, GREEDY, rule)
            assert (got.token_ids, got.text, got.finish_reason) == \
                (expected.token_ids, expected.text, expected.finish_reason), (prompt, rule)
        if kind == "distilled":   # rounds really accepted drafts, so states were committed mid-block
            assert engine.stats.accepted / engine.stats.rounds > 1.1
    finally:
        engine.stop()


@pytest.fixture(scope="module")
def tiny_vocab_pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("hybrid-vocab")
    config = hybrid_config(sampling.VOCAB, "float32", 4, 0, 0)
    config["text_config"].update(hidden_size=32, intermediate_size=64, tie_word_embeddings=False)
    config["tie_word_embeddings"] = False   # untied, like the 27B
    (root / "config.json").write_text(json.dumps(config))
    save_weights(hybrid_weights(config, seed=3), root, shards=1)
    target = load_model(inspect_checkpoint(root), torch.float32, "cpu", 64)
    text = {**config, **config["text_config"]}
    # seed 6: a random draft whose argmax the target often samples (chain tau ~1.3)
    draft = random_model(draft_config(text, layers=1, block_size=4, taps=[1, 3]), seed=6)
    return target, DFlashDrafter(draft, target)


@pytest.mark.parametrize("verifier", [ChainVerifier(block_size=4), TreeVerifier(budget=8)], ids=["chain", "tree8"])
def test_speculative_sampling_matches_plain_sampling_on_a_hybrid(tiny_vocab_pair, verifier, monkeypatch):
    target, drafter = tiny_vocab_pair
    log = sampling.WalkLog(lane_module.walk)
    monkeypatch.setattr(lane_module, "walk", log)
    runner = BatchRunner(target, Method("under-test", drafter, verifier), capacity=32, seed=11)
    assert runner.max_running == 1          # the slot rule: a speculative hybrid, one sequence at a time
    counts = sampling.sampled_counts(runner)
    assert runner.spec.times.tau > 1.2   # drafts are accepted often: states are committed mid-block
    assert log.deepest >= 2
    if verifier.needs.tree_attention:
        assert log.compacted         # an accepted path skipped rows: a sibling's state was not kept
    assert sampling.chi_square_p(counts, sampling.exact_distribution(target)) > 1e-3


def test_bench_reports_the_state_share_of_a_ddtree_round(hybrid_dir, drafts, tmp_path):
    import subprocess
    import sys

    out = tmp_path / "bench.json"
    cmd = [sys.executable, "-m", "serving.bench", "--model", str(hybrid_dir), "--draft", str(drafts["distilled"]),
           "--methods", "none,ddtree:16", "--max-tokens", "16", "--limit", "2", "--threads", "1", "--json", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    rows = {m["label"]: m for m in json.loads(out.read_text())["methods"]}
    assert all(m["equal_to_none"] for m in rows.values())
    assert 0 < rows["ddtree:16"]["state_share"] < 1 and rows["ddtree:16"]["rounds"] > 0
    assert "state" in done.stdout
