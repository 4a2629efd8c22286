"""One byte arithmetic (serving.contract.sizes) read by both sides: the parameter count ddops fit
estimates from a config.json is the one the runtime predicts for itself from the same file,
dense, hybrid and draft alike, DFlash 2's convs and selector included. Pure, milliseconds."""

from __future__ import annotations

import json

import pytest

from ddops.fit import facts_from_config
from serving import memory
from serving.contract.sizes import AttentionShape, DeltaNetShape, kv_bytes, linear_state_bytes
from serving.models.config import parse_model_config
from serving.speculative.draft_model import DraftConfig
from tests.fit.conftest import CONFIGS

TARGETS = ["Llama-3.1-8B-Instruct", "Qwen3-8B", "Qwen3.6-27B", "smollm2-135m-instruct"]
DRAFTS = ["Qwen3-8B-DFlash-b16", "Qwen3.6-27B-DFlash", "smollm2-135m-instruct-dflash"]
DFLASH2 = {"conv_kernel_size": 4, "conv_group_size": 64, "selector_rank": 256, "selector_top_k": 8}


def config(name: str) -> dict:
    return json.loads((CONFIGS / name / "config.json").read_text())


def as_dflash2(c: dict) -> dict:
    return {**c, "architectures": ["DFlash2DraftModel"], "dflash_config": {**c.get("dflash_config", {}), **DFLASH2}}


@pytest.mark.parametrize("name", TARGETS)
def test_a_target_has_one_parameter_count(name):
    c = config(name)
    assert facts_from_config(c, name).params == memory.target_params(parse_model_config(c, name))


@pytest.mark.parametrize("dflash2", [False, True], ids=["dflash", "dflash2"])
@pytest.mark.parametrize("name", DRAFTS)
def test_a_draft_has_one_parameter_count(name, dflash2):
    c = as_dflash2(config(name)) if dflash2 else config(name)
    assert facts_from_config(c, name).params == memory.draft_params(DraftConfig.from_dict(c, name))


def test_dflash2_adds_two_convs_a_layer_and_a_selector():
    c = config("Qwen3-8B-DFlash-b16")
    h, layers, vocab = c["hidden_size"], c["num_hidden_layers"], c["vocab_size"]
    conv = 2 * 4 * h + h * 2 * 4 * (h // 64)   # base_kernel [2, K, H], kernel_projection [2*K*H/64, H]
    added = layers * 2 * conv + 2 * vocab * 256 + h * 256
    assert facts_from_config(as_dflash2(c), "x").params - facts_from_config(c, "x").params == added


def test_a_gated_attention_bias_covers_the_gate_rows():
    """Qwen3.5's qkv_proj holds [query | gate] per head: its bias is as wide."""
    plain, gated = (AttentionShape(64, 4, 2, 16, gated=g, bias=True) for g in (False, True))
    assert gated.params - plain.params == 64 * 4 * 16 + 4 * 16


def test_cache_bytes():
    assert kv_bytes(2, 3, 64, 10, 2) == 2 * 3 * 64 * 2 * 10 * 2
    assert kv_bytes(1, 1, 192, 1, 2, v_head_dim=128) == (192 + 128) * 2
    assert kv_bytes(1, 8, 128, 3, 0.5 + 1 / 16) == int(8 * 256 * 3 * (0.5 + 1 / 16))
    s = DeltaNetShape(key_heads=2, value_heads=4, key_head_dim=8, value_head_dim=16, conv_kernel=4)
    assert linear_state_bytes(s, 3, 2) == 3 * (3 * (2 * 2 * 8 + 4 * 16) * 2 + 4 * 8 * 16 * 4)
