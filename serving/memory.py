"""Memory the runtime holds, measured from its tensors, beside its own prediction from config.json.

Allocation model (the same one ddops.fit uses for this runtime): every parameter in the
runtime dtype, plus one preallocated target KV pool of `context_length + draft_tokens` rows
over all layers (the extra rows hold one verify pass past the context), or `--max-total-tokens`
rows when set; running sequences share it (serving.engine.kv_pool). The draft's context K/V
and the features kept for it grow per sequence and are not preallocated, so neither side
counts them. /server_info reports
both under `memory` so an operator (and a test) can compare prediction and measurement.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

from serving import speculative
from serving.models.kv_cache import KVCache

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
WALK_DEPTH = 3  # decoder -> method -> drafter -> model


def measure(decoder) -> dict:
    """Bytes of the loaded parameters (shared tensors once) and of the KV caches the decoder owns."""
    modules, caches = _reachable(decoder)
    seen, weights = set(), 0
    for module in modules:
        for tensor in [*module.parameters(), *module.buffers()]:
            if tensor.data_ptr() not in seen:
                seen.add(tensor.data_ptr())
                weights += tensor.numel() * tensor.element_size()
    kv = sum(t.numel() * t.element_size() for c in caches for t in (c.k, c.v))
    return {"weights_bytes": weights, "kv_cache_bytes": kv}


def _reachable(root) -> tuple[list[nn.Module], list[KVCache]]:
    modules: dict[int, nn.Module] = {}
    caches: dict[int, KVCache] = {}
    frontier = [root]
    for _ in range(WALK_DEPTH + 1):
        found = []
        for obj in frontier:
            for value in vars(obj).values() if hasattr(obj, "__dict__") else ():
                if isinstance(value, nn.Module):
                    modules.setdefault(id(value), value)
                elif isinstance(value, KVCache):
                    caches.setdefault(id(value), value)
                elif hasattr(value, "__dict__") and not isinstance(value, (torch.Tensor, type)):
                    found.append(value)
        frontier = found
    return list(modules.values()), list(caches.values())


def predict(args) -> dict:
    """From config.json (and the draft's): parameter bytes and KV cache bytes for resolved `args`."""
    target = _config(args.model_path)
    width = DTYPE_BYTES[args.dtype]
    params = dense_params(target)
    method = speculative.resolve(args.speculative_algorithm)
    extra = 0
    if method.speculative and args.speculative_draft_model_path:
        draft = _config(args.speculative_draft_model_path)
        params += draft_params(draft)
        block = args.speculative_num_draft_tokens or int(draft.get("block_size") or 16)
        extra = max(block, (args.speculative_ddtree_budget or block - 1) + 1) if method.takes_budget else block
    heads = target["num_attention_heads"]
    head_dim = target.get("head_dim") or target["hidden_size"] // heads
    kv_heads = target.get("num_key_value_heads") or heads
    rows = args.max_total_tokens or args.context_length + extra
    kv = target["num_hidden_layers"] * kv_heads * head_dim * 2 * rows * width
    return {"predicted_weights_bytes": params * width, "predicted_kv_cache_bytes": kv,
            "predicted_bytes": params * width + kv}


def report(decoder, args) -> dict:
    measured = measure(decoder)
    return {**measured, "measured_bytes": measured["weights_bytes"] + measured["kv_cache_bytes"], **predict(args)}


def dense_params(c: dict) -> int:
    """Llama / Qwen3 parameter count: embeddings (+ untied head), attention, MLP, norms."""
    hidden, vocab = c["hidden_size"], c["vocab_size"]
    embed = vocab * hidden * (1 if c.get("tie_word_embeddings") else 2)
    return embed + c["num_hidden_layers"] * _layer_params(c) + hidden


def draft_params(c: dict) -> int:
    """A DFlash draft: fc over the tapped target layers, its norm, the layers, the final norm."""
    hidden = c["hidden_size"]
    taps = len((c.get("dflash_config") or {}).get("target_layer_ids") or [])
    return taps * hidden * hidden + hidden + c["num_hidden_layers"] * _layer_params(c) + hidden


def _layer_params(c: dict) -> int:
    hidden, heads = c["hidden_size"], c["num_attention_heads"]
    d = c.get("head_dim") or hidden // heads
    kv = c.get("num_key_value_heads") or heads
    attention = hidden * heads * d * 2 + 2 * hidden * kv * d
    if c.get("attention_bias"):
        attention += heads * d + 2 * kv * d
    if c.get("model_type", "").startswith("qwen3"):
        attention += 2 * d  # per-head q and k RMSNorm
    return attention + 3 * hidden * c["intermediate_size"] + 2 * hidden


def _config(model_dir: str) -> dict:
    return json.loads((Path(model_dir) / "config.json").read_text())
