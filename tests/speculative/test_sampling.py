"""Sampling is lossless: speculative output is distributed exactly as plain sampling.

A tiny-vocabulary target (5 tokens, top-k 3) makes the exact distribution of the first five
generated tokens computable (at most 3^5 sequences); speculative samples are compared with
it by a chi-square goodness-of-fit test, for a chain and for trees of several budgets whose
walks go three drafts deep, accept non-first children (compacted KV reused next round) and
feed the accepted features back to the draft. Seeds are fixed, so the outcome is
deterministic. A deliberately broken walk (accept the first child whatever the target drew)
shows the test has the power to notice a biased sampler.
"""

import json

import pytest
import torch

from serving.engine import StopRule, run_alone
from serving.models import inspect_checkpoint, load_model
from serving.sampling import SamplingParams, logits_to_probs
from serving.speculative.base import Method
from serving.speculative.chain import ChainVerifier
from serving.speculative.ddtree import TreeVerifier
from serving.engine.batch import BatchRunner
from serving.speculative import lane as lane_module
from serving.speculative.dflash import DFlashDrafter
from serving.speculative.tree import Tree
from serving.tools.tiny import random_weights, save_weights
from serving.tools.tiny_draft import draft_config, random_model

VOCAB, LENGTH, SAMPLES = 5, 5, 2000
PROMPT = [1, 3, 2, 4]
PARAMS = SamplingParams(temperature=0.8, top_k=3)
CONFIG = dict(architectures=["Qwen3ForCausalLM"], model_type="qwen3", hidden_size=32, intermediate_size=64,
              num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, head_dim=16,
              vocab_size=VOCAB, max_position_embeddings=64, rms_norm_eps=1e-6, rope_theta=10000.0,
              tie_word_embeddings=False, torch_dtype="float32")


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny-vocab")
    (root / "config.json").write_text(json.dumps(CONFIG))
    save_weights(random_weights(CONFIG, seed=3), root, shards=1)
    target = load_model(inspect_checkpoint(root), torch.float32, "cpu", 64)
    draft = random_model(draft_config(CONFIG, layers=1, block_size=4, taps=[0, 1]), seed=4)
    return target, DFlashDrafter(draft, target)


def exact_distribution(target) -> dict[tuple[int, ...], float]:
    """P(t1..t5 | PROMPT) under plain sampling with PARAMS, for every sequence it can draw."""
    out, frontier = {}, {(): 1.0}
    while frontier:
        prefix, p = frontier.popitem()
        ids = PROMPT + list(prefix)
        logits, _ = target.forward(torch.tensor(ids), torch.arange(len(ids)), target.new_cache(len(ids)),
                                   last_only=True)
        for token, q in enumerate(logits_to_probs(logits, PARAMS)[0].tolist()):
            if q > 0:
                (out if len(prefix) + 1 == LENGTH else frontier)[prefix + (token,)] = p * q
    return out


def sampled_counts(runner) -> dict[tuple[int, ...], int]:
    counts: dict[tuple[int, ...], int] = {}
    for _ in range(SAMPLES):
        key = tuple(run_alone(runner, PROMPT, PARAMS, StopRule(LENGTH)).token_ids)
        counts[key] = counts.get(key, 0) + 1
    return counts


def chi_square_p(counts: dict, probs: dict) -> float:
    """Goodness of fit; cells expecting fewer than 5 samples are pooled into one. A sequence
    plain sampling cannot produce (outside top-k) gives 0."""
    if not set(counts) <= set(probs):
        return 0.0
    cells = sorted(probs)
    expected = torch.tensor([probs[c] for c in cells]) * sum(counts.values())
    observed = torch.tensor([float(counts.get(c, 0)) for c in cells])
    small = expected < 5
    expected = torch.cat([expected[~small], expected[small].sum().view(1)])
    observed = torch.cat([observed[~small], observed[small].sum().view(1)])
    keep = expected > 0
    stat = ((observed[keep] - expected[keep]) ** 2 / expected[keep]).sum()
    dof = int(keep.sum()) - 1
    return float(torch.special.gammaincc(torch.tensor(dof / 2), stat / 2))


class WalkLog:
    """Wraps the decoder's walk: deepest accepted path, and whether a path skipped a row."""

    def __init__(self, walk):
        self.walk, self.deepest, self.compacted = walk, 0, False

    def __call__(self, tree, choices):
        path, bonus = self.walk(tree, choices)
        self.deepest = max(self.deepest, len(path) - 1)
        self.compacted |= path[-1] != len(path) - 1
        return path, bonus


@pytest.mark.parametrize("verifier", [ChainVerifier(block_size=4), TreeVerifier(budget=4), TreeVerifier(budget=8),
                                      TreeVerifier(budget=24)], ids=["chain", "tree4", "tree8", "tree24"])
def test_speculative_sampling_matches_plain_sampling(pair, verifier, monkeypatch):
    target, drafter = pair
    log = WalkLog(lane_module.walk)
    monkeypatch.setattr(lane_module, "walk", log)
    runner = BatchRunner(target, Method("under-test", drafter, verifier), capacity=32, seed=11, prefix_cache=False)
    counts = sampled_counts(runner)
    assert runner.spec.times.tau > 1.2  # drafts are accepted often: the walk is really exercised
    assert log.deepest >= 3  # a walk went three drafts deep
    if verifier.needs.tree_attention:
        assert log.compacted  # an accepted path skipped rows: its KV was compacted and reused
    assert chi_square_p(counts, exact_distribution(target)) > 1e-3


def test_the_test_catches_a_biased_walk(pair, monkeypatch):
    def trust_the_draft(tree: Tree, choices):
        row, path = 0, [0]
        while tree.children[row]:  # follow the draft's best child whatever the target drew
            row = min(tree.children[row].values())
            path.append(row)
        return path, choices[row]

    monkeypatch.setattr("serving.speculative.lane.walk", trust_the_draft)
    target, drafter = pair
    runner = BatchRunner(target, Method("biased", drafter, ChainVerifier(block_size=4)), capacity=32, seed=11,
                         prefix_cache=False)
    assert chi_square_p(sampled_counts(runner), exact_distribution(target)) < 1e-6
