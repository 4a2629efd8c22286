"""Load an HF checkpoint directory (config.json + safetensors, single or sharded) into a model:
CausalLM (Llama, Qwen3) or HybridLM (Qwen3.5/3.6 text, layout in qwen3_5_weights).

`inspect_checkpoint` reads only config.json and the safetensors headers, so a missing file,
an unsupported architecture or a wrong tensor shape is reported (naming the file and tensor)
in a fraction of a second, before the server listens.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open

from serving.models import qwen3_5_weights
from serving.models.config import ModelConfig, ModelError, read_model_config
from serving.models.llama import CausalLM
from serving.models.qwen3_5 import HybridLM

SINGLE = "model.safetensors"
INDEX = "model.safetensors.index.json"


@dataclass(frozen=True)
class Checkpoint:
    directory: Path
    config: ModelConfig
    files: dict[str, Path]          # HF tensor name -> safetensors file holding it
    prefix: str = "model."          # where the text model's tensors live


def inspect_checkpoint(model_dir) -> Checkpoint:
    directory = Path(model_dir)
    if not directory.is_dir():
        raise ModelError(f"{directory}: model directory does not exist")
    config = read_model_config(directory)
    files = tensor_files(directory)
    shapes = _shapes(files)
    prefix = qwen3_5_weights.text_prefix(files) if config.hybrid else "model."
    if config.hybrid:
        qwen3_5_weights.log_skipped(files)
    expected = qwen3_5_weights.expected_tensors(config, prefix) if config.hybrid else expected_tensors(config)
    for name, shape in expected.items():
        if name not in files:
            where = directory / (INDEX if (directory / INDEX).is_file() else SINGLE)
            raise ModelError(f"{where}: missing tensor {name}")
        if tuple(shapes[name]) != shape:
            raise ModelError(f"{files[name]}: tensor {name} has shape {list(shapes[name])}, "
                             f"expected {list(shape)} from config.json")
    return Checkpoint(directory, config, files, prefix)


def expected_tensors(c: ModelConfig) -> dict[str, tuple[int, ...]]:
    H, D, I = c.hidden_size, c.head_dim, c.intermediate_size
    q, kv = c.num_attention_heads * D, c.num_key_value_heads * D
    out = {"model.embed_tokens.weight": (c.vocab_size, H), "model.norm.weight": (H,)}
    if not c.tie_word_embeddings:
        out["lm_head.weight"] = (c.vocab_size, H)
    for i in range(c.num_hidden_layers):
        p = f"model.layers.{i}."
        out.update({p + "input_layernorm.weight": (H,), p + "post_attention_layernorm.weight": (H,),
                    p + "self_attn.q_proj.weight": (q, H), p + "self_attn.k_proj.weight": (kv, H),
                    p + "self_attn.v_proj.weight": (kv, H), p + "self_attn.o_proj.weight": (H, q),
                    p + "mlp.gate_proj.weight": (I, H), p + "mlp.up_proj.weight": (I, H),
                    p + "mlp.down_proj.weight": (H, I)})
        if c.attention_bias:
            out.update({p + "self_attn.q_proj.bias": (q,), p + "self_attn.k_proj.bias": (kv,),
                        p + "self_attn.v_proj.bias": (kv,)})
        if c.qk_norm:
            out.update({p + "self_attn.q_norm.weight": (D,), p + "self_attn.k_norm.weight": (D,)})
    return out


def load_model(checkpoint: Checkpoint, dtype: torch.dtype, device, positions: int) -> CausalLM | HybridLM:
    """Build the model for `positions` RoPE positions and fill it from the checkpoint."""
    hybrid = checkpoint.config.hybrid
    with torch.device("meta"):
        model = (HybridLM if hybrid else CausalLM)(checkpoint.config, dtype)
    model = model.to_empty(device=device)
    if checkpoint.config.tie_word_embeddings:
        model.lm_head_weight = model.embed_tokens.weight
    with TensorReader(checkpoint.files) as read:
        with torch.no_grad():
            if hybrid:
                qwen3_5_weights.fill(model, checkpoint.config, read, checkpoint.prefix)
            else:
                _fill(model, checkpoint.config, read)
    model.init_rope(positions)
    model.pack_weights()
    return model.eval()


def _fill(model: CausalLM, c: ModelConfig, read) -> None:
    model.embed_tokens.weight.copy_(read("model.embed_tokens.weight"))
    model.norm.weight.copy_(read("model.norm.weight"))
    if not c.tie_word_embeddings:
        model.lm_head_weight.copy_(read("lm_head.weight"))
    for i, layer in enumerate(model.layers):
        p = f"model.layers.{i}."
        attn = layer.self_attn
        layer.input_layernorm.weight.copy_(read(p + "input_layernorm.weight"))
        layer.post_attention_layernorm.weight.copy_(read(p + "post_attention_layernorm.weight"))
        attn.qkv_proj.weight.copy_(torch.cat([read(p + f"self_attn.{n}_proj.weight") for n in "qkv"]))
        if c.attention_bias:
            attn.qkv_proj.bias.copy_(torch.cat([read(p + f"self_attn.{n}_proj.bias") for n in "qkv"]))
        attn.o_proj.weight.copy_(read(p + "self_attn.o_proj.weight"))
        if c.qk_norm:
            attn.q_norm.weight.copy_(read(p + "self_attn.q_norm.weight"))
            attn.k_norm.weight.copy_(read(p + "self_attn.k_norm.weight"))
        layer.mlp.gate_up_proj.weight.copy_(
            torch.cat([read(p + "mlp.gate_proj.weight"), read(p + "mlp.up_proj.weight")]))
        layer.mlp.down_proj.weight.copy_(read(p + "mlp.down_proj.weight"))


def tensor_files(directory: Path) -> dict[str, Path]:
    """Tensor name -> file holding it, from model.safetensors.index.json or model.safetensors."""
    index = directory / INDEX
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise ModelError(f"{index}: unreadable weight_map ({e!r})") from None
        for name, file in weight_map.items():
            if not (directory / file).is_file():
                raise ModelError(f"{index}: tensor {name} maps to missing file {file}")
        return {name: directory / file for name, file in weight_map.items()}
    single = directory / SINGLE
    if not single.is_file():
        raise ModelError(f"{directory}: missing file {SINGLE} (or {INDEX} for a sharded checkpoint)")
    return {name: single for name in _open(single).keys()}


def _shapes(files: dict[str, Path]) -> dict[str, list[int]]:
    shapes = {}
    for file in set(files.values()):
        handle = _open(file)
        for name in handle.keys():
            shapes[name] = handle.get_slice(name).get_shape()
    missing = [n for n, f in files.items() if n not in shapes]
    if missing:
        raise ModelError(f"{files[missing[0]]}: missing tensor {missing[0]} listed in {INDEX}")
    return shapes


def _open(file: Path):
    try:
        return safe_open(str(file), framework="pt")
    except Exception as e:  # safetensors raises its own error types for corrupt headers
        raise ModelError(f"{file}: not a readable safetensors file ({e})") from None


class TensorReader:
    """Reads tensors by HF name, keeping one handle per shard open."""

    def __init__(self, files: dict[str, Path]):
        self.files = files
        self.handles = {}

    def __enter__(self):
        return self.read

    def __exit__(self, *exc):
        self.handles.clear()

    def read(self, name: str) -> torch.Tensor:
        file = self.files[name]
        if file not in self.handles:
            self.handles[file] = _open(file)
        return self.handles[file].get_tensor(name)
