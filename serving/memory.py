"""Memory the runtime holds, measured from its tensors, beside its own prediction from config.json.

Allocation model (the same one ddops.fit uses for this runtime): every parameter in the
runtime dtype, plus one preallocated target KV pool of `context_length + draft_tokens` rows
over all full-attention layers (the extra rows hold one verify pass past the context), or
`--max-total-tokens` rows when set; running sequences share it (serving.engine.kv_pool).
Hybrid targets add Gated DeltaNet state slots (serving.contract.runtime.state_slots: one per
running sequence when decoding plainly in the batch runner, one when a speculative method
serves them one sequence at a time, whose KV is then context + verify rows): per layer and
slot the conv state ((K-1) x conv channels, runtime dtype) and the recurrent state
(Hv x dk x dv, fp32). The draft's context K/V, the features kept for it and a verify
pass's per-row states are transient, so neither side counts them. /server_info reports
both under `memory` so an operator (and a test) can compare prediction and measurement.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

from serving import speculative
from serving.contract.runtime import state_slots
from serving.models.config import text_part
from serving.models.hybrid_cache import HybridCache
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
    kv = sum(t.numel() * t.element_size() for c in caches if isinstance(c, KVCache) for t in (c.k, c.v))
    state = sum(c.state_bytes() for c in caches if hasattr(c, "state_bytes"))   # HybridCache, HybridPool
    return {"weights_bytes": weights, "kv_cache_bytes": kv, "state_cache_bytes": state}


def _reachable(root) -> tuple[list[nn.Module], list]:
    modules: dict[int, nn.Module] = {}
    caches: dict[int, object] = {}
    frontier = [root]
    for _ in range(WALK_DEPTH + 1):
        found = []
        for obj in frontier:
            for value in vars(obj).values() if hasattr(obj, "__dict__") else ():
                if isinstance(value, nn.Module):
                    modules.setdefault(id(value), value)
                elif isinstance(value, KVCache):
                    caches.setdefault(id(value), value)
                elif isinstance(value, HybridCache):
                    caches.setdefault(id(value), value)
                    found.append(value)
                elif hasattr(value, "__dict__") and not isinstance(value, (torch.Tensor, type)):
                    found.append(value)
        frontier = found
    return list(modules.values()), list(caches.values())


def predict(args) -> dict:
    """From config.json (and the draft's): parameter bytes and KV cache bytes for resolved `args`."""
    target = text_part(_config(args.model_path), args.model_path)
    width = DTYPE_BYTES[args.dtype]
    params = dense_params(target) if "linear_num_value_heads" not in target else hybrid_params(target)
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
    kinds = layer_kinds(target)
    linear = kinds.count("linear_attention")
    slots = state_slots(bool(linear), method.speculative, args.max_running_requests)
    # a hybrid served one sequence at a time: one cache of context + verify rows, no pool
    serial = linear and method.speculative
    rows = args.context_length + extra if serial else args.max_total_tokens or args.context_length + extra
    kv = kinds.count("full_attention") * kv_heads * head_dim * 2 * rows * width
    state = slots * linear * linear_state_bytes(target, width) if linear else 0
    return {"predicted_weights_bytes": params * width, "predicted_kv_cache_bytes": kv,
            "predicted_state_cache_bytes": state, "predicted_bytes": params * width + kv + state}


def report(decoder, args) -> dict:
    m = measure(decoder)
    return {**m, "measured_bytes": m["weights_bytes"] + m["kv_cache_bytes"] + m["state_cache_bytes"],
            **predict(args)}


def kernels(decoder) -> dict:
    """Which implementation runs each part of the decoder's target."""
    return target_kernels(getattr(decoder, "target", None) or getattr(decoder, "model", None))


def target_kernels(target) -> dict:
    """Which implementation runs each part of a target (hybrids name their linear-attention path)."""
    return {"attention": "torch sdpa", **getattr(target, "kernels", {})}


def layer_kinds(c: dict) -> list[str]:
    """full_attention / linear_attention per layer (dense models: all full)."""
    if "linear_num_value_heads" not in c:
        return ["full_attention"] * c["num_hidden_layers"]
    if c.get("layer_types"):
        return list(c["layer_types"])
    interval = int(c.get("full_attention_interval", 4))
    return ["full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(c["num_hidden_layers"])]


def linear_state_bytes(c: dict, width: int) -> int:
    """One Gated DeltaNet layer's state: conv (K-1) x channels in the runtime dtype, recurrent fp32."""
    hv, dk, dv = c["linear_num_value_heads"], c["linear_key_head_dim"], c["linear_value_head_dim"]
    channels = 2 * c["linear_num_key_heads"] * dk + hv * dv
    return (c.get("linear_conv_kernel_dim", 4) - 1) * channels * width + hv * dk * dv * 4


def hybrid_params(c: dict) -> int:
    """Qwen3.5 text parameters: gated attention (q_proj doubled) or Gated DeltaNet, SwiGLU, norms."""
    hidden, vocab, inter = c["hidden_size"], c["vocab_size"], c["intermediate_size"]
    heads, d = c["num_attention_heads"], c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]
    kv = c.get("num_key_value_heads") or heads
    attention = hidden * heads * d * 3 + 2 * hidden * kv * d + 2 * d
    hv, dv, kernel = c["linear_num_value_heads"], c["linear_value_head_dim"], c.get("linear_conv_kernel_dim", 4)
    channels = 2 * c["linear_num_key_heads"] * c["linear_key_head_dim"] + hv * dv
    linear = hidden * (channels + 2 * hv * dv + 2 * hv) + channels * kernel + 2 * hv + dv
    mixers = sum(attention if kind == "full_attention" else linear for kind in layer_kinds(c))
    embed = vocab * hidden * (1 if c.get("tie_word_embeddings") else 2)
    return embed + mixers + c["num_hidden_layers"] * (3 * hidden * inter + 2 * hidden) + hidden


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
