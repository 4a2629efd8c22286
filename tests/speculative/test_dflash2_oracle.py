"""DFlash 2 drafts load exactly: z-lab's `dflash` 0.1.0 package is the oracle.

Its DFlash2DraftModel (grouped dynamic causal convs, candidate selector, output_multiplier,
final_logit_softcapping and input_embedding_scale set) is saved with its own save_pretrained;
our loader and drafter must give the same draft logits (fp32, 1e-5) and the same proposals
(greedy chain; under sampling the same per-row distributions given the same path) over two
rounds that reuse the context cache, for the saved folder, a sharded `model.`-prefixed copy
with the codebooks stored without `.weight`, and two sequences packed in one draft pass.
"""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

import transformers  # noqa: E402  (dev dependencies: a missing one must fail, not skip)
from dflash import model as dflash_model
from serving.speculative.dflash import DFlashDrafter, load_model
from serving.speculative.selector import Candidates
from serving.tools import train_draft

BLOCK, MASK, STARTS, TOP_K = 5, 0, (5, 10), 6  # two rounds: blocks at positions 5..9, then 10..14
DFLASH2 = {"block_size": BLOCK, "mask_token_id": MASK, "target_layer_ids": [1, 2], "conv_group_size": 8,
           "conv_kernel_size": 3, "selector_rank": 8, "selector_top_k": TOP_K,
           "output_multiplier": 0.8, "input_embedding_scale": 1.5}

# our draft's logits come out of the target's oneDNN-packed head copy (serving.models.cpu_gemm.
# pack_matrices), the package's out of F.linear: the two products differ in the last bits (up to
# 1.6e-5 on these logits); which tokens are proposed is compared exactly where it matters
PACKAGE_TOLERANCE = 1e-4


def reference_draft(target):
    """A z-lab DFlash2DraftModel shaped to the tiny qwen3 target, with seeded O(1) weights and a
    selector strong enough to overrule the draft's argmax."""
    c = target.config
    config = transformers.Qwen3Config(
        hidden_size=c.hidden_size, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, vocab_size=c.vocab_size, max_position_embeddings=32,
        rms_norm_eps=1e-6, num_target_layers=c.num_hidden_layers, final_logit_softcapping=20.0,
        dflash_config=DFLASH2, layer_types=["sliding_attention", "full_attention"], use_sliding_window=True,
        sliding_window=4, rope_parameters={"rope_type": "default", "rope_theta": 50000.0})
    model = dflash_model.DFlash2DraftModel(config).eval()
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("base_kernel"):
                p.copy_(0.3 * torch.randn(p.shape, generator=g))
                p[:, 0] += 1.0
            elif "codebook" in name:
                p.copy_(torch.randn(p.shape, generator=g))
            elif p.dim() == 2:
                p.copy_(torch.randn(p.shape, generator=g) * p.shape[1] ** -0.5)
            else:
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
    return model


def reference_rounds(model, target, tokens, feats, temperature=0.0):
    """The package's own rounds (its dflash_generate's draft step): (logits, path, candidates, q)."""
    cache, done, out = dflash_model._make_cache(model.config), 0, []
    head = lambda h: F.linear(h, target.lm_head_weight)  # noqa: E731  (the target's lm_head)
    with torch.no_grad():
        for start in STARTS:
            ids = torch.tensor([[int(tokens[start])] + [MASK] * (BLOCK - 1)])
            noise = F.embedding(ids, target.embed_tokens.weight) * DFLASH2["input_embedding_scale"]
            hidden = model(target_hidden=feats[None, done:start], noise_embedding=noise,
                           position_ids=torch.arange(done, start + BLOCK)[None], past_key_values=cache, use_cache=True)
            dflash_model._crop_to(cache, start)
            path, candidates, q = model.propose(hidden[:, 1:], ids[:, 0], head, temperature)
            out.append((model.compute_logits(hidden[:, 1:], head)[0].float(), path[0], candidates[0], q))
            done = start
    return out


def our_rounds(path, target, tokens, feats) -> list[Candidates]:
    drafter, done, out = DFlashDrafter(load_model(path, torch.float32, "cpu"), target), 0, []
    context = drafter.context(drafter.pool(64), 0, 64)
    for start in STARTS:
        drafter.extend(context, feats[done:start])
        out.append(drafter.propose([context], [int(tokens[start])], [BLOCK - 1])[0])
        done = start
    return out


@pytest.fixture(scope="module")
def pair(targets, tmp_path_factory):
    """(target, reference model, its save_pretrained folder, tokens [16], features [16, 2H])."""
    target = targets["qwen3"]
    reference = reference_draft(target)
    folder = tmp_path_factory.mktemp("dflash2") / "saved"
    reference.save_pretrained(folder)
    tokens = torch.randint(3, 500, (16,), generator=torch.Generator().manual_seed(0))
    feats, _ = train_draft.features_and_labels(target, tokens.tolist(), (1, 2))
    return target, reference, folder, tokens, feats


def assert_same(ours: list[Candidates], reference) -> None:
    for mine, (logits, path, candidates, _) in zip(ours, reference):
        torch.testing.assert_close(mine.logits, logits, atol=PACKAGE_TOLERANCE, rtol=PACKAGE_TOLERANCE)
        assert mine.tokens.sort(-1).values.tolist() == candidates.sort(-1).values.tolist()
        assert mine.chain(BLOCK - 1) == path.tolist()


def test_saved_draft_proposes_what_the_package_does(pair):
    target, reference, folder, tokens, feats = pair
    raw = json.loads((folder / "config.json").read_text())
    assert raw["architectures"] == ["DFlash2DraftModel"] and "block_size" not in raw  # only dflash_config's
    expected = reference_rounds(reference, target, tokens, feats)
    ours = our_rounds(folder, target, tokens, feats)
    assert_same(ours, expected)
    # the selector matters here: its chain is not the draft's argmax in some row
    assert any(m.chain(BLOCK - 1) != m.logits.argmax(-1).tolist() for m in ours)


def test_sampled_rows_have_the_package_distribution(pair):
    """Under sampling the package draws each row from softmax(score / T) given the path so far;
    ours gives the same distribution (per candidate id) given that same path."""
    target, reference, folder, tokens, feats = pair
    torch.manual_seed(5)
    expected = reference_rounds(reference, target, tokens, feats, temperature=0.7)
    for mine, (_, path, candidates, q) in zip(our_rounds(folder, target, tokens, feats), expected):
        scores = mine.first
        for d in range(BLOCK - 1):
            if d:
                scores = mine.pairs[d - 1][mine.tokens[d - 1].tolist().index(int(path[d - 1]))]
            ours = dict(zip(mine.tokens[d].tolist(), torch.softmax(scores / 0.7, -1).tolist()))
            theirs = dict(zip(candidates[d].tolist(), q[0, d].tolist()))
            assert ours.keys() == theirs.keys()
            assert max(abs(ours[t] - theirs[t]) for t in ours) < 1e-5
        drawn = mine.walk(BLOCK - 1, 0.7, torch.Generator().manual_seed(0))
        assert drawn[2].shape == (BLOCK - 1, TOP_K) and set(drawn[0].tolist()) <= set(mine.tokens.flatten().tolist())


def test_sharded_prefixed_copy_with_bare_codebook_names_loads(pair, tmp_path):
    target, reference, folder, tokens, feats = pair
    weights = load_file(folder / "model.safetensors")
    names = sorted(weights)
    out = tmp_path / "sharded"
    out.mkdir()
    (out / "config.json").write_text((folder / "config.json").read_text())
    weight_map = {}
    for i, part in enumerate((names[: len(names) // 2], names[len(names) // 2:]), start=1):
        file = f"model-0000{i}-of-00002.safetensors"
        stored = {("model." + n).removesuffix(".weight") if "codebook" in n else "model." + n: weights[n] for n in part}
        save_file(stored, out / file)
        weight_map.update({n: file for n in stored})
    assert "model.candidate_selector.predecessor_codebook" in weight_map
    (out / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    assert_same(our_rounds(out, target, tokens, feats), reference_rounds(reference, target, tokens, feats))


def test_packed_sequences_propose_what_each_does_alone(pair):
    """Two sequences in one draft pass: the convs read only their own block's rows."""
    target, _, folder, tokens, feats = pair
    drafter = DFlashDrafter(load_model(folder, torch.float32, "cpu"), target)
    pool = drafter.pool(128)
    alone, packed = [], [drafter.context(pool, 0, 64), drafter.context(pool, 64, 64)]
    for context, start in zip(packed, STARTS):
        drafter.extend(context, feats[:start])
    together = drafter.propose(packed, [int(tokens[s]) for s in STARTS], [BLOCK - 1, 2])
    for start, depth in zip(STARTS, (BLOCK - 1, 2)):
        own = drafter.context(drafter.pool(64), 0, 64)
        drafter.extend(own, feats[:start])
        alone.append(drafter.propose([own], [int(tokens[start])], [depth])[0])
    for a, b in zip(together, alone):
        torch.testing.assert_close(a.logits, b.logits, atol=1e-5, rtol=1e-5)
        assert a.chain(BLOCK) == b.chain(BLOCK)
