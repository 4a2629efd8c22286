"""HF reference hybrids (transformers' Qwen3_5ForCausalLM) saved as checkpoints, and ours loaded from them."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

# (name, text config overrides): layer patterns, GQA ratios, head dims, key/value head ratios
SHAPES = {
    "lllf-lllf": dict(num_hidden_layers=8, num_attention_heads=6, num_key_value_heads=2, head_dim=16,
                      linear_num_key_heads=2, linear_num_value_heads=6, linear_key_head_dim=16,
                      linear_value_head_dim=8),
    "flfl-mha": dict(num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=4, head_dim=32,
                     linear_num_key_heads=4, linear_num_value_heads=4, linear_key_head_dim=8,
                     linear_value_head_dim=16, layer_types=["full_attention", "linear_attention"] * 2),
    "llll-mqa": dict(num_hidden_layers=5, num_attention_heads=8, num_key_value_heads=1, head_dim=8,
                     linear_num_key_heads=1, linear_num_value_heads=2, linear_key_head_dim=32,
                     linear_value_head_dim=32, linear_conv_kernel_dim=3,
                     layer_types=["linear_attention"] * 4 + ["full_attention"]),
}


def reference(shape: str, seed: int = 0):
    """A fp32 HF Qwen3_5ForCausalLM with noise on every norm weight (a fresh init hides (1+w)-vs-w)."""
    torch.manual_seed(seed)
    cfg = transformers.Qwen3_5TextConfig(
        vocab_size=256, hidden_size=64, intermediate_size=128, max_position_embeddings=512,
        rope_parameters={"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25},
        **SHAPES[shape])
    model = transformers.Qwen3_5ForCausalLM(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(torch.randn_like(p) * 0.3)
    return model


@pytest.fixture(scope="session", autouse=True)
def few_threads():
    torch.set_num_threads(1)   # 2 shared cores: more threads only spin against each other


@pytest.fixture(scope="session")
def hf_pairs(tmp_path_factory):
    """shape -> (HF model, our HybridLM loaded from the HF checkpoint it saved)."""
    from serving.models import inspect_checkpoint, load_model

    transformers.logging.set_verbosity_error()
    pairs = {}
    for shape in SHAPES:
        ref = reference(shape)
        path = tmp_path_factory.mktemp(shape)
        ref.save_pretrained(path)
        pairs[shape] = (ref, load_model(inspect_checkpoint(path), torch.float32, "cpu", 512))
    return pairs
