"""Model facts from config.json and safetensors headers, checked against published numbers."""

from __future__ import annotations

import json
import struct

import pytest

from ddops.fit.model import FULL, LINEAR, ModelFactsError, facts_from_config, layer_kinds
from ddops.fit.read import read_model
from ddops.draft_pairing import LocalFiles, PreflightError


def test_llama_31_8b_parameter_count_is_exact(llama8b):
    assert llama8b.params == 8_030_261_248  # the published count
    assert llama8b.weight_bytes() == 2 * 8_030_261_248  # bf16 checkpoint


def test_qwen3_8b_matches_its_card(qwen8b):
    # card: 8.2B parameters, 6.95B without embeddings (embed + untied head = 2 x 151936 x 4096)
    assert abs(qwen8b.params / 8.2e9 - 1) < 0.01
    assert abs((qwen8b.params - 2 * 151936 * 4096) / 6.95e9 - 1) < 0.005


def test_hybrid_keeps_kv_only_on_its_16_full_attention_layers(qwen27b):
    assert qwen27b.attention.layers == 16 and qwen27b.num_layers == 64
    assert qwen27b.linear.layers == 48
    kinds = layer_kinds(json.loads(json.dumps({"full_attention_interval": 4})), 8)
    assert kinds == [LINEAR, LINEAR, LINEAR, FULL] * 2


def test_hybrid_state_geometry_from_the_config(qwen27b):
    s = qwen27b.linear
    assert (s.k_heads, s.v_heads, s.k_head_dim, s.v_head_dim, s.conv_kernel) == (16, 48, 128, 128, 4)
    assert s.ssm_dtype == "float32"
    assert s.conv_dim == 10240  # 2 x 16 x 128 + 48 x 128 (docs/references.md, section "Model facts in the fit tests")


def test_27b_weights_and_draft_size(qwen27b, qwen27b_draft):
    assert 26.5e9 < qwen27b.params < 27.5e9  # "27B" (text model)
    assert abs(qwen27b_draft.params / 1.73e9 - 1) < 0.01  # fc 131M + 5 x ~320M
    assert qwen27b_draft.block_size == 16
    assert qwen27b_draft.attention.layers == 5  # every draft layer keeps KV (sliding ones too)


def _safetensors(path, tensors: dict[str, tuple[str, list[int]]]) -> None:
    """A real safetensors file (header + zero bytes), written without torch."""
    sizes = {"F32": 4, "BF16": 2, "I8": 1}
    header, offset = {}, 0
    for name, (dtype, shape) in tensors.items():
        n = sizes[dtype]
        for d in shape:
            n *= d
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + n]}
        offset += n
    blob = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(blob)) + blob + bytes(offset))


def test_safetensors_headers_give_exact_parameters_and_keep_quantized_bytes(tmp_path):
    config = {"architectures": ["LlamaForCausalLM"], "hidden_size": 8, "num_attention_heads": 2,
              "num_hidden_layers": 1, "intermediate_size": 16, "vocab_size": 32, "torch_dtype": "bfloat16"}
    (tmp_path / "config.json").write_text(json.dumps(config))
    _safetensors(tmp_path / "model-1.safetensors", {"a": ("BF16", [32, 8]), "q": ("I8", [16, 8])})
    _safetensors(tmp_path / "model-2.safetensors", {"b": ("F32", [3, 5])})
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {"a": "model-1.safetensors", "q": "model-1.safetensors", "b": "model-2.safetensors"}}))
    facts = read_model(LocalFiles(), str(tmp_path))
    assert facts.params_source == "safetensors headers"
    assert facts.params == 32 * 8 + 15 and facts.fixed_bytes == 128
    assert facts.weight_bytes("float32") == 4 * (32 * 8 + 15) + 128


def test_missing_config_names_the_file(tmp_path):
    with pytest.raises(PreflightError, match=r"config\.json: does not exist"):
        read_model(LocalFiles(), str(tmp_path))


def test_config_without_a_needed_key_names_the_key():
    with pytest.raises(ModelFactsError, match="hidden_size"):
        facts_from_config({"num_attention_heads": 4, "num_hidden_layers": 2, "vocab_size": 8}, "m")


def test_mixture_of_experts_without_headers_is_refused_not_guessed():
    config = {"hidden_size": 8, "num_attention_heads": 2, "num_hidden_layers": 1, "intermediate_size": 16,
              "vocab_size": 32, "num_experts": 8}
    with pytest.raises(ModelFactsError, match="num_experts"):
        facts_from_config(config, "moe")
