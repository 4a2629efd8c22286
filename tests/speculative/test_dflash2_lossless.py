"""With a DFlash 2 draft, every speculative method of METHODS gives plain decoding's output:
greedy token for token (stops and max_tokens inside rounds), and a seeded sampled request the
same tokens as plain sampling with that seed (the target's draws are keyed by position).

The draft is the tiny qwen3 target's distilled DFlash 1 draft as a DFlash2DraftModel: its
layers, near-identity convs (seeded perturbations) and a seeded selector strong enough to
change some of its chains, so rounds accept several tokens and the selector's path is the one
verified.
"""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from serving.contract import METHODS as CONTRACT
from serving.engine.stops import StopRule
from serving.models.tokenizer import Tokenizer
from serving.sampling import SamplingParams
from serving.speculative.dflash import DFlashDrafter, load_model
from serving.speculative.draft_model import DFlashDraftModel, DraftConfig
from serving.tools.draft_files import dflash2_config, save_draft

from .test_lossless import GREEDY, cases, engine_for

# every speculative method; a tree method also at a small budget (5 nodes, below the block)
SETTINGS = [(name, budget) for name, m in CONTRACT.items() if m.is_speculative
            for budget in ((None, 5) if m.uses_tree_budget else (None,))]


def dflash2_from(dflash1, out, seed: int = 0):
    """The DFlash 1 draft's weights in a DFlash 2 draft (convs near identity, a seeded selector)."""
    raw = json.loads((dflash1 / "config.json").read_text())
    config = dflash2_config(raw, conv_group_size=16, selector_rank=8, selector_top_k=8)
    model = DFlashDraftModel(DraftConfig.from_dict(config))
    weights, g = load_file(dflash1 / "model.safetensors"), torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name in weights:
                p.copy_(weights[name])
            elif name.endswith("base_kernel"):
                p.copy_(0.05 * torch.randn(p.shape, generator=g))
                p[:, 0] += 1.0
            elif "codebook" in name:
                p.copy_(torch.randn(p.shape, generator=g))
            else:
                p.copy_(0.05 * torch.randn(p.shape, generator=g))
    return save_draft(model, config, out)


@pytest.fixture(scope="module")
def setup(tiny_dirs, targets, distilled_drafts, tmp_path_factory):
    """(target, tokenizer, the DFlash 2 draft, plain greedy runs over test_lossless's cases)."""
    target, tokenizer = targets["qwen3"], Tokenizer.from_dir(tiny_dirs["qwen3"])
    draft = dflash2_from(distilled_drafts["qwen3"], tmp_path_factory.mktemp("dflash2") / "draft")
    plain = engine_for("none", target, tokenizer, None)
    runs = [(prompt, rule, plain.generate(prompt, GREEDY, rule)) for prompt, rule in cases(plain, tokenizer)[::3]]
    sampled = [(prompt, plain.generate(prompt, SamplingParams(temperature=0.8, seed=7), StopRule(max_new_tokens=24)))
               for prompt, _, _ in runs[:4]]
    plain.stop()
    return target, tokenizer, draft, runs, sampled


def test_the_selector_changes_proposals(setup):
    """The draft under test really proposes through its selector: some chains differ from the
    argmax chain the same rows would give."""
    target, tokenizer, draft, runs, _ = setup
    drafter = DFlashDrafter(load_model(draft, torch.float32, "cpu"), target)
    prompt, _, longest = max(runs, key=lambda run: len(run[2].token_ids))
    ids = list(prompt) + list(longest.token_ids)
    from serving.tools.train_draft import features_and_labels

    feats, _ = features_and_labels(target, ids, drafter.cfg.target_layer_ids)
    changed = 0
    for start in range(1, len(ids) - 8):
        context = drafter.context(drafter.pool(len(ids) + 8), 0, len(ids) + 8)
        drafter.extend(context, feats[:start])
        c = drafter.propose([context], [ids[start]], [7])[0]
        changed += c.chain(7) != c.logits.argmax(-1).tolist()
    assert changed


@pytest.mark.parametrize("name, budget", SETTINGS)
def test_every_method_with_a_dflash2_draft_equals_plain(setup, name, budget):
    target, tokenizer, draft, runs, sampled = setup
    engine = engine_for(name, target, tokenizer, draft, None, budget)
    try:
        for prompt, rule, expected in runs:
            got = engine.generate(prompt, GREEDY, rule)
            assert (got.token_ids, got.finish_reason) == (expected.token_ids, expected.finish_reason), (prompt, rule)
        assert engine.stats.avg_spec_accept_length > 1.0  # rounds accepted drafts: boundaries fell inside
        for prompt, expected in sampled:
            got = engine.generate(prompt, SamplingParams(temperature=0.8, seed=7), StopRule(max_new_tokens=24))
            assert got.token_ids == expected.token_ids, prompt
    finally:
        engine.stop()
