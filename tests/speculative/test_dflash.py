"""The DFlash drafter: released layout, context cache across rounds, masks, width guard."""

import json

import pytest
import torch

from serving.speculative import PreflightError
from serving.speculative.dflash import DFlashDrafter, load_model
from serving.speculative.draft_model import DraftConfig, visible
from serving.tools import train_draft
from serving.tools.tiny_draft import draft_config, random_model, save_draft


def test_weights_use_the_released_names(random_drafts):
    from safetensors import safe_open

    with safe_open(str(random_drafts["llama"] / "model.safetensors"), "pt") as f:
        names = set(f.keys())
    assert {"fc.weight", "hidden_norm.weight", "norm.weight", "layers.0.self_attn.q_norm.weight",
            "layers.1.mlp.down_proj.weight", "layers.0.input_layernorm.weight"} <= names
    assert not any("embed" in n or "lm_head" in n for n in names)  # shared with the target


def test_round_by_round_drafting_equals_one_batched_pass(targets, random_drafts):
    """The context cache keeps exactly the committed rows: drafting at anchors 5 then 9 round by
    round gives the logits the training pass computes for both blocks at once."""
    target = targets["qwen3"]
    model = load_model(random_drafts["qwen3"], torch.float32, "cpu")
    tokens = torch.randint(3, 500, (24,), generator=torch.Generator().manual_seed(0))
    feats, _ = train_draft.features_and_labels(target, tokens.tolist(), model.cfg.target_layer_ids)
    with torch.no_grad():
        # [2, B-1, V]: the logits block_loss scores (without sampled negatives)
        batched = target.lm_head(train_draft.block_hidden(model, target, tokens, feats, torch.tensor([5, 9])))
    drafter = DFlashDrafter(model, target)
    context = drafter.context(drafter.pool(32), 0, 32)
    drafter.extend(context, feats[:5])
    first, = drafter.propose([context], [int(tokens[5])], [model.cfg.block_size - 1])
    assert context.length == 5  # the block's K/V were not kept
    drafter.extend(context, feats[5:9])
    second, = drafter.propose([context], [int(tokens[9])], [model.cfg.block_size - 1])
    assert context.length == 9
    torch.testing.assert_close(first, batched[0], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(second, batched[1], atol=1e-4, rtol=1e-4)


def test_sliding_and_causal_layers_follow_the_config():
    raw = draft_config({"num_hidden_layers": 8, "hidden_size": 16, "num_attention_heads": 2, "vocab_size": 32},
                       layers=3)
    raw.update(layer_types=["sliding_attention", "sliding_attention", "full_attention"], sliding_window=4,
               use_sliding_window=True)
    cfg = DraftConfig.from_dict(raw)
    assert cfg.causal == (True, True, False) and cfg.window == (4, 4, None)
    assert DraftConfig.from_dict(dict(raw, is_causal=False)).causal == (False, False, False)
    q, k = torch.tensor([10, 11]), torch.tensor([5, 6, 7, 10, 11])
    assert visible(q, k, causal=True, window=4).tolist() == [[False, False, True, True, False],
                                                             [False, False, False, True, True]]
    assert visible(q, k, causal=False, window=None) is None


def test_captured_width_is_checked_at_the_first_forward(targets, random_drafts):
    model = load_model(random_drafts["llama"], torch.float32, "cpu")
    drafter = DFlashDrafter(model, targets["llama"])
    with pytest.raises(PreflightError, match=r"draft expects 128 = 2 layers x 64 but the target captured 64"):
        drafter.extend(drafter.context(drafter.pool(8), 0, 8), torch.zeros(3, 64))


def test_weight_names_and_shapes_are_checked(tmp_path, random_drafts):
    raw = json.loads((random_drafts["llama"] / "config.json").read_text())
    model = random_model(raw, 0)
    save_draft(model, dict(raw, intermediate_size=96), tmp_path / "shape")
    with pytest.raises(PreflightError, match=r"layers.0.mlp.down_proj.weight has shape \(64, 128\), config implies \(64, 96\)"):
        load_model(tmp_path / "shape", torch.float32, "cpu")
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty/config.json").write_text(json.dumps(raw))
    with pytest.raises(PreflightError, match="no draft weights"):
        load_model(tmp_path / "empty", torch.float32, "cpu")


def test_sampled_softmax_training_runs_and_learns(tiny_dirs):
    raw = draft_config(json.loads((tiny_dirs["llama"] / "config.json").read_text()))
    model = random_model(raw, 0)
    target = train_draft.load_target(tiny_dirs["llama"], positions=64)
    text = torch.arange(3, 35).tolist()
    feats, picks = train_draft.features_and_labels(target, text, model.cfg.target_layer_ids)
    example = [(torch.tensor(text), feats, picks)]
    anchors = torch.arange(1, 20)
    before = train_draft.block_loss(model, target, example[0][0], feats, picks, anchors).item()
    train_draft.train(model, target, example, steps=30, seed=0, negatives=64)
    after = train_draft.block_loss(model, target, example[0][0], feats, picks, anchors).item()
    assert after < before - 1.0  # full-vocabulary loss falls although steps saw 64 negatives


def test_reduced_vocabulary_proposes_only_its_tokens_and_stays_lossless(targets, distilled_drafts, tmp_path):
    from serving.engine import StopRule, run_alone
    from serving.engine.batch import BatchRunner
    from serving.sampling import SamplingParams
    from serving.speculative.base import Method
    from serving.speculative.ddtree import TreeVerifier
    from serving.speculative.dflash import DRAFT_VOCAB, load_vocab

    target = targets["llama"]
    model = load_model(distilled_drafts["llama"], torch.float32, "cpu")
    ids = list(range(3, 500, 2))  # every other token: the target often wants one outside
    (tmp_path / DRAFT_VOCAB).write_text(json.dumps({"token_ids": ids}))
    assert load_vocab(tmp_path, target.config.vocab_size) == ids
    full, small = DFlashDrafter(model, target), DFlashDrafter(model, target, vocab=ids)
    feats = torch.randn(6, full.feature_width)
    contexts = [d.context(d.pool(16), 0, 16) for d in (full, small)]
    for drafter, context in zip((full, small), contexts):
        drafter.extend(context, feats)
    columns = full.propose(contexts[:1], [7], [3])[0][:, ids]
    proposal, = small.propose(contexts[1:], [7], [3])
    torch.testing.assert_close(proposal, columns)  # the same logits, fewer columns
    tree = TreeVerifier(budget=8).plan(7, proposal, 9, small.vocab)
    assert set(tree.tokens[1:]) <= set(ids)
    greedy = SamplingParams(temperature=0)
    spec = BatchRunner(target, Method("small-vocab", small, TreeVerifier(budget=8)), capacity=128)
    plain = BatchRunner(target, capacity=128)
    for prompt in ([5, 9, 13], [40, 2, 77, 301, 8], [11]):
        runs = [run_alone(runner, prompt, greedy, StopRule(24)).token_ids for runner in (plain, spec)]
        assert runs[0] == runs[1] and len(runs[0]) == 24
    assert spec.spec.times.tau > 1.0
    (tmp_path / DRAFT_VOCAB).write_text(json.dumps({"token_ids": [3, 3, 100000]}))
    with pytest.raises(PreflightError, match="token_ids must be distinct ids below"):
        load_vocab(tmp_path, target.config.vocab_size)
