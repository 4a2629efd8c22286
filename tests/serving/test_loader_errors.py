"""A broken checkpoint fails at inspection with one line naming the file and the tensor or key."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from serving.models import ModelError, inspect_checkpoint


@pytest.fixture
def llama_copy(tiny_llama, tmp_path):
    return shutil.copytree(tiny_llama, tmp_path / "model")


@pytest.fixture
def qwen_copy(tiny_qwen3, tmp_path):
    return shutil.copytree(tiny_qwen3, tmp_path / "model")


def edit_config(path, **changes):
    config = json.loads((path / "config.json").read_text())
    config.update(changes)
    (path / "config.json").write_text(json.dumps(config))


def fails(path) -> str:
    with pytest.raises(ModelError) as info:
        inspect_checkpoint(path)
    message = str(info.value)
    assert "\n" not in message
    return message


def test_missing_directory(tmp_path):
    assert "does not exist" in fails(tmp_path / "nowhere")


def test_missing_config(llama_copy):
    (llama_copy / "config.json").unlink()
    assert fails(llama_copy) == f"{llama_copy / 'config.json'}: missing file (an HF checkpoint needs config.json)"


def test_missing_weights_file(llama_copy):
    (llama_copy / "model.safetensors").unlink()
    message = fails(llama_copy)
    assert str(llama_copy) in message and "model.safetensors" in message


def test_unsupported_architecture(llama_copy):
    edit_config(llama_copy, architectures=["MambaForCausalLM"])
    message = fails(llama_copy)
    assert message.startswith(str(llama_copy / "config.json"))
    assert "MambaForCausalLM" in message and "LlamaForCausalLM" in message


def test_unsupported_rope_scaling(llama_copy):
    edit_config(llama_copy, rope_scaling={"rope_type": "longrope", "factor": 4.0})
    assert "rope_type='longrope'" in fails(llama_copy)


def test_wrong_tensor_shape_names_file_and_tensor(llama_copy):
    weights = load_file(llama_copy / "model.safetensors")
    weights["model.layers.1.mlp.up_proj.weight"] = torch.zeros(7, 64)
    save_file(weights, llama_copy / "model.safetensors")
    message = fails(llama_copy)
    assert message.startswith(str(llama_copy / "model.safetensors"))
    assert "model.layers.1.mlp.up_proj.weight" in message and "[7, 64]" in message


def test_config_disagreeing_with_weights(llama_copy):
    edit_config(llama_copy, hidden_size=96)
    assert "model.embed_tokens.weight has shape" in fails(llama_copy)


def test_missing_tensor_in_a_shard(qwen_copy):
    index = json.loads((qwen_copy / "model.safetensors.index.json").read_text())
    name = "model.layers.3.self_attn.q_norm.weight"
    shard = qwen_copy / index["weight_map"].pop(name)
    (qwen_copy / "model.safetensors.index.json").write_text(json.dumps(index))
    weights = load_file(shard)
    del weights[name]
    save_file(weights, shard)
    message = fails(qwen_copy)
    assert "model.safetensors.index.json" in message and name in message


def test_missing_shard_file(qwen_copy):
    (qwen_copy / "model-00002-of-00002.safetensors").unlink()
    message = fails(qwen_copy)
    assert "model.safetensors.index.json" in message and "model-00002-of-00002.safetensors" in message


def test_corrupt_safetensors(llama_copy):
    (llama_copy / "model.safetensors").write_bytes(b"not a safetensors file")
    assert "not a readable safetensors file" in fails(llama_copy)


def test_invalid_config_value(llama_copy):
    edit_config(llama_copy, num_attention_heads=0)
    assert "num_attention_heads=0" in fails(llama_copy)


@pytest.mark.parametrize("changes,named", [
    ({"hidden_act": "gelu"}, "hidden_act='gelu'"),
    ({"mlp_bias": True}, "mlp_bias"),
    ({"use_sliding_window": True}, "use_sliding_window"),
])
def test_unimplemented_features_are_refused(llama_copy, changes, named):
    edit_config(llama_copy, **changes)
    assert named in fails(llama_copy)
