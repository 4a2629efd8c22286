"""Released drafts load exactly: z-lab's own `dflash` package is the oracle.

Its DFlashDraftModel (transformers' Qwen3Config: RoPE written as `rope_parameters`) is saved
with save_pretrained; our loader must give the same draft logits, fp32 within 1e-5, over two
rounds that reuse the context cache, for an all-full-attention layout and a sliding-window
(causal, YaRN) layout.
"""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

import transformers  # noqa: E402  (dev dependencies: a missing one must fail, not skip)
from dflash import model as dflash_model
from serving.speculative import PreflightError
from serving.speculative.dflash import DFlashDrafter, load_model
from serving.tools import train_draft

BLOCK, MASK, STARTS = 4, 0, (5, 9)  # two rounds: blocks at positions 5..8, then 9..12
LAYOUTS = {
    "full": dict(layer_types=["full_attention"] * 2,
                 rope_parameters={"rope_type": "default", "rope_theta": 50000.0}),
    "sliding": dict(layer_types=["sliding_attention", "full_attention"], use_sliding_window=True,
                    sliding_window=4,  # round 2's rows look back past the window
                    rope_parameters={"rope_type": "yarn", "rope_theta": 50000.0, "factor": 4.0,
                                     "original_max_position_embeddings": 8}),
}

# our draft's logits come out of the target's oneDNN-packed head copy (serving.models.cpu_gemm.
# pack_matrices), the package's out of F.linear: the two products differ in the last bits (up to
# 1.6e-5 on these logits), far inside what a wrong layout moves (over 1e-3, checked below)
PACKAGE_TOLERANCE = 1e-4


def reference_draft(target, layout: str):
    """A z-lab DFlashDraftModel shaped to the tiny qwen3 target, with seeded O(1) weights."""
    c = target.config
    config = transformers.Qwen3Config(
        hidden_size=c.hidden_size, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=c.vocab_size,
        max_position_embeddings=32, rms_norm_eps=1e-6, block_size=BLOCK, num_target_layers=c.num_hidden_layers,
        dflash_config={"mask_token_id": MASK, "target_layer_ids": [1, 2]}, **LAYOUTS[layout])
    model = dflash_model.DFlashDraftModel(config).eval()
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for p in model.parameters():
            scale = p.shape[1] ** -0.5 if p.dim() == 2 else 0.1
            p.copy_((0.0 if p.dim() == 2 else 1.0) + scale * torch.randn(p.shape, generator=g))
    return model


def reference_rounds(model, target, tokens, feats) -> list[torch.Tensor]:
    """The package's own round: draft call with new context rows, then crop to the block start."""
    cache, done, out = dflash_model._make_cache(model.config), 0, []
    head = lambda h: F.linear(h, target.lm_head_weight)  # noqa: E731  (the target's lm_head)
    with torch.no_grad():
        for start in STARTS:
            ids = torch.tensor([[int(tokens[start])] + [MASK] * (BLOCK - 1)])
            hidden = model(target_hidden=feats[None, done:start], noise_embedding=F.embedding(ids, target.embed_tokens.weight),
                           position_ids=torch.arange(done, start + BLOCK)[None], past_key_values=cache, use_cache=True)
            dflash_model._crop_to(cache, start)
            out.append(model.compute_logits(hidden[:, 1:], head)[0].float())
            done = start
    return out


def our_rounds(path, target, tokens, feats) -> list[torch.Tensor]:
    drafter, done, out = DFlashDrafter(load_model(path, torch.float32, "cpu"), target), 0, []
    context = drafter.context(drafter.pool(64), 0, 64)
    for start in STARTS:
        drafter.extend(context, feats[done:start])
        out.append(drafter.propose([context], [int(tokens[start])], [BLOCK - 1])[0])
        done = start
    return out


def target_inputs(target):
    tokens = torch.randint(3, 500, (16,), generator=torch.Generator().manual_seed(0))
    feats, _ = train_draft.features_and_labels(target, tokens.tolist(), (1, 2))
    return tokens, feats


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_our_loader_matches_the_dflash_package(targets, tmp_path, layout):
    target = targets["qwen3"]
    reference = reference_draft(target, layout)
    reference.save_pretrained(tmp_path)
    raw = json.loads((tmp_path / "config.json").read_text())
    assert "rope_parameters" in raw and "rope_theta" not in raw  # the transformers-5 spelling
    tokens, feats = target_inputs(target)
    for ours, ref in zip(our_rounds(tmp_path, target, tokens, feats), reference_rounds(reference, target, tokens, feats)):
        torch.testing.assert_close(ours, ref, atol=PACKAGE_TOLERANCE, rtol=PACKAGE_TOLERANCE)
    # the layout matters: theta 10000 (what a reader ignoring rope_parameters uses) differs
    (tmp_path / "config.json").write_text(json.dumps(dict(raw, rope_parameters={"rope_theta": 10000.0})))
    wrong = our_rounds(tmp_path, target, tokens, feats)[1]
    assert (wrong - reference_rounds(reference, target, tokens, feats)[1]).abs().max() > 1e-3


def test_sharded_prefixed_checkpoint_with_buffers_loads(targets, tmp_path):
    target = targets["qwen3"]
    reference = reference_draft(target, "full")
    reference.save_pretrained(tmp_path / "plain")
    weights = load_file(tmp_path / "plain/model.safetensors")
    names = sorted(weights)
    shards = {"model-00001-of-00002.safetensors": names[: len(names) // 2],
              "model-00002-of-00002.safetensors": names[len(names) // 2:]}
    out = tmp_path / "sharded"
    out.mkdir()
    (out / "config.json").write_text((tmp_path / "plain/config.json").read_text())
    weight_map = {"rotary_emb.inv_freq": "model-00001-of-00002.safetensors"}
    for file, part in shards.items():
        tensors = {f"model.{n}": weights[n] for n in part}
        if file.startswith("model-00001"):
            tensors["rotary_emb.inv_freq"] = torch.ones(8)  # a buffer, not a weight: ignored
        save_file(tensors, out / file)
        weight_map.update({n: file for n in tensors})
    (out / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    tokens, feats = target_inputs(target)
    for ours, ref in zip(our_rounds(out, target, tokens, feats), reference_rounds(reference, target, tokens, feats)):
        torch.testing.assert_close(ours, ref, atol=PACKAGE_TOLERANCE, rtol=PACKAGE_TOLERANCE)
    weights["layers.0.self_attn.extra_proj.weight"] = torch.zeros(2, 2)
    save_file(weights, tmp_path / "plain/model.safetensors")
    with pytest.raises(PreflightError, match=r"model.safetensors: unexpected tensor layers.0.self_attn.extra_proj.weight"):
        load_model(tmp_path / "plain", torch.float32, "cpu")
