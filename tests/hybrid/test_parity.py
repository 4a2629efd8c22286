"""Our HybridLM against transformers' Qwen3_5 (fp32, tiny random configs): logits and states.

Prefill crosses a 64-row chunk boundary (chunked form); short chains and decode steps run the
by-depth recurrence; both must give HF's logits within 1e-4.
"""

import logging

import pytest
import torch

from tests.hybrid.conftest import SHAPES, reference, transformers

TOL = 1e-4


def hf_logits(ref, ids):
    with torch.no_grad():
        return ref(ids[None]).logits[0]


@pytest.mark.parametrize("shape", sorted(SHAPES))
@pytest.mark.parametrize("length", [20, 70])
def test_prefill_logits_match_transformers(hf_pairs, shape, length):
    ref, ours = hf_pairs[shape]
    ids = torch.randint(0, 256, (length,), generator=torch.Generator().manual_seed(length))
    got, _ = ours.forward(ids, torch.arange(length), ours.new_cache(128))
    assert (got - hf_logits(ref, ids)).abs().max().item() < TOL


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_prefill_then_chain_then_steps_match_one_pass(hf_pairs, shape):
    ref, ours = hf_pairs[shape]
    ids = torch.randint(0, 256, (90,), generator=torch.Generator().manual_seed(1))
    cache, out = ours.new_cache(128), []
    # a chunked prefill (> 32 rows), a by-depth chain of 6, then single decode steps
    for begin, end in [(0, 40), (40, 46)] + [(t, t + 1) for t in range(46, 90)]:
        logits, _ = ours.forward(ids[begin:end], torch.arange(begin, end), cache)
        cache.commit(end - begin)
        out.append(logits)
    assert cache.length == 90
    assert (torch.cat(out) - hf_logits(ref, ids)).abs().max().item() < TOL


def test_states_match_transformers_cache(hf_pairs):
    ref, ours = hf_pairs["lllf-lllf"]
    ids = torch.randint(0, 256, (50,), generator=torch.Generator().manual_seed(2))
    cache = ours.new_cache(64)
    ours.forward(ids, torch.arange(50), cache)
    cache.commit(50)
    hf_cache = transformers.DynamicCache(config=ref.config)
    with torch.no_grad():
        ref(ids[None], cache=hf_cache, use_cache=True)
    linear = ours.config.linear_layers
    kernel = ours.config.linear.conv_kernel
    for slot, layer in enumerate(linear):
        hf_rec = hf_cache.layers[layer].recurrent_states[0][0]        # [Hv, dk, dv]
        hf_conv = hf_cache.layers[layer].conv_states[0][0, :, -(kernel - 1):]   # [C, K-1]
        assert (cache.recurrent[slot] - hf_rec).abs().max().item() < 1e-5
        assert (cache.conv[slot].T - hf_conv).abs().max().item() < 1e-6


def test_conditional_generation_layout_loads_the_text_model(tmp_path, caplog):
    """Qwen3_5ForConditionalGeneration: text under text_config and model.language_model.*, vision skipped."""
    from serving.models import inspect_checkpoint, load_model

    text = reference("lllf-lllf").config
    vision = transformers.Qwen3_5VisionConfig(depth=1, hidden_size=16, intermediate_size=32, num_heads=2,
                                              out_hidden_size=64)
    torch.manual_seed(3)
    ref = transformers.Qwen3_5ForConditionalGeneration(
        transformers.Qwen3_5Config(text_config=text.to_dict(), vision_config=vision.to_dict())).eval()
    with torch.no_grad():
        for name, p in ref.named_parameters():
            if "norm" in name and "visual" not in name:
                p.add_(torch.randn_like(p) * 0.3)
    ref.save_pretrained(tmp_path)
    with caplog.at_level(logging.INFO, logger="serving.models"):
        checkpoint = inspect_checkpoint(tmp_path)
        ours = load_model(checkpoint, torch.float32, "cpu", 128)
    assert checkpoint.prefix == "model.language_model."
    assert "vision tower skipped" in caplog.text and "model.visual." in caplog.text
    ids = torch.randint(0, 256, (30,), generator=torch.Generator().manual_seed(3))
    got, _ = ours.forward(ids, torch.arange(30), ours.new_cache(64))
    with torch.no_grad():
        want = ref(input_ids=ids[None]).logits[0]
    assert (got - want).abs().max().item() < TOL


def test_a_missing_deltanet_tensor_is_named(tmp_path):
    from safetensors.torch import load_file, save_file

    from serving.models import ModelError, inspect_checkpoint

    reference("lllf-lllf").save_pretrained(tmp_path)
    weights = load_file(tmp_path / "model.safetensors")
    del weights["model.layers.1.linear_attn.A_log"]
    save_file(weights, tmp_path / "model.safetensors")
    with pytest.raises(ModelError, match=r"missing tensor model\.layers\.1\.linear_attn\.A_log"):
        inspect_checkpoint(tmp_path)
