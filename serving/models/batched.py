"""One decode step for many sequences through a `CausalLM`: a single forward, B rows.

Every projection, norm and MLP runs once over [B, hidden]; attention runs per sequence on its
own KV cache (each a contiguous slice of one pool), exactly as the single-sequence path runs
it for one new token, so no padding and no mask are needed and each row's attention numerics
are the single-sequence ones. Works for the dense decoders in serving.models.llama; a model
without those parts reports `supports(model) == False` and the engine decodes it one by one.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from serving.models.kv_cache import KVCache
from serving.models.llama import Attention, CausalLM, DecoderLayer
from serving.models.rope import apply_rope


def supports(model) -> bool:
    return isinstance(model, CausalLM) and all(
        type(layer) is DecoderLayer and type(layer.self_attn) is Attention for layer in model.layers)


@torch.inference_mode()
def decode_step(model: CausalLM, tokens: torch.Tensor, positions: torch.Tensor, caches: list[KVCache],
                capture: tuple[int, ...] = ()) -> tuple[torch.Tensor, torch.Tensor | None]:
    """tokens, positions [B] (one new token per sequence); caches[b] is sequence b's cache.

    Writes each row's K/V at caches[b].length without committing (as `forward` does).
    Returns logits [B, vocab] float32 and hidden [B, len(capture) * hidden] or None.
    """
    x = model.embed(tokens)                                           # [B, hidden]
    cos, sin = model.cos.index_select(0, positions), model.sin.index_select(0, positions)
    captured = {}
    for i, layer in enumerate(model.layers):
        x = x + _attention(layer.self_attn, layer.input_layernorm(x), cos, sin, caches, i)
        x = x + layer.mlp(layer.post_attention_layernorm(x))
        if i in capture:
            captured[i] = x
    hidden = torch.cat([captured[i] for i in capture], dim=-1) if capture else None
    return model.lm_head(model.norm(x)), hidden


def _attention(attn: Attention, x, cos, sin, caches: list[KVCache], layer: int) -> torch.Tensor:
    B, G, KV, D = x.shape[0], attn.heads // attn.kv_heads, attn.kv_heads, attn.head_dim
    q, k, v = attn.qkv_proj(x).split(attn.splits, dim=-1)
    q, k, v = q.view(B, attn.heads, D), k.view(B, KV, D), v.view(B, KV, D)
    if attn.q_norm is not None:
        q, k = attn.q_norm(q), attn.k_norm(k)
    q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    # query head h = kv * G + g: per sequence [1, KV, G, D] against its own [1, KV, L, D]
    q = q.view(B, KV, G, D)
    out = torch.empty(B, KV, G, D, dtype=x.dtype, device=x.device)
    for b, cache in enumerate(caches):
        keys, values = cache.write(layer, k[b, :, None], v[b, :, None])          # [KV, L, D]
        out[b] = F.scaled_dot_product_attention(q[b, None], keys[None], values[None])[0]
    return attn.o_proj(out.view(B, attn.heads * D))
