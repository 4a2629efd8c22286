"""One forward through a `CausalLM` for many sequences at once: ragged rows, one pass.

The rows of all sequences are packed back to back ([N] = sum of each sequence's T_b rows:
one decode token, a prefill chunk, or a speculative tree). Every projection, norm and MLP runs
once over [N, hidden]; attention runs per sequence on its own KV cache (each a contiguous
slice of one pool) with the mask the single-sequence path would use for those rows (none for
one row, causal for a chunk or a chain, the ancestor-only tree mask for a tree). That is the
block-diagonal mask of the whole batch without ever building it: no row sees another
sequence's keys, no padding, and each row's attention numerics are the single-sequence ones.
Works for the dense decoders in serving.models.llama; a model without those parts reports
`supports(model) == False`. Hybrids (serving.models.qwen3_5) have a plain decode step only
(`decodes`, serving.models.hybrid_batched): they join batched plain decoding, and speculative
rounds for them run one sequence at a time, each tree through its own forward
(serving.contract.runtime.one_at_a_time).
"""

from __future__ import annotations

import weakref

import torch

from serving.models import hybrid_batched
from serving.models.decode_attention import DecodeRows
from serving.models.kv_cache import KVCache
from serving.models.llama import Attention, CausalLM, DecoderLayer, attend, attention_mask
from serving.models.packing import row_slices
from serving.models.qwen3_5 import HybridLM

_PACKED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()   # model -> supports(model)


def supports(model) -> bool:
    """A packed forward exists for this model (its every layer is the plain decoder layer).
    Decided once per model: its layers never change after load, and forward asks every call."""
    if not isinstance(model, CausalLM):
        return False
    if model not in _PACKED:
        _PACKED[model] = all(type(layer) is DecoderLayer and type(layer.self_attn) is Attention
                             for layer in model.layers)
    return _PACKED[model]


def decodes(model) -> bool:
    """A batched plain decode step exists for this target (every `supports` model, and hybrids)."""
    return supports(model) or isinstance(model, HybridLM)


def decode_step(model, tokens: torch.Tensor, positions: torch.Tensor, caches: list,
                capture: tuple[int, ...] = ()) -> tuple[torch.Tensor, torch.Tensor | None]:
    """tokens, positions [B] (one new token per sequence) -> logits [B, vocab], hidden [B, ...] or None."""
    if isinstance(model, HybridLM):
        return hybrid_batched.decode_step(model, tokens, positions, caches, capture)
    return forward(model, tokens, positions, caches, [1] * len(caches), capture=capture)


@torch.inference_mode()
def forward(model: CausalLM, tokens: torch.Tensor, positions: torch.Tensor, caches: list[KVCache],
            counts: list[int], tree_masks: list | None = None, capture: tuple[int, ...] = (),
            logit_rows: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """tokens, positions [N]: counts[b] rows of sequence b, in order; caches[b] its KV cache;
    tree_masks[b] a bool [T_b, T_b] ancestor mask, or None (causal rows).

    Writes each sequence's K/V at caches[b].length without committing (as `CausalLM.forward`).
    Returns logits [N or len(logit_rows), vocab] fp32 and hidden [N, len(capture) * H] or None.
    """
    if not supports(model):   # hybrids: a batched decode step only (decode_step)
        raise TypeError(f"{type(model).__name__} has no packed forward; run each sequence through its own forward")
    x = model.embed(tokens)                                           # [N, hidden]
    cos, sin = model.cos.index_select(0, positions), model.sin.index_select(0, positions)
    groups, masks = model.config.kv_groups, tree_masks or [None] * len(caches)
    masks = [attention_mask(n, c.length, m, groups, x.device) for n, c, m in zip(counts, caches, masks)]
    one_row = all(n == 1 for n in counts) and all(m is None for m in masks)
    decode = DecodeRows.plan(caches, x.device) if one_row else None     # plain decode: one call per layer
    captured = {}
    for i, layer in enumerate(model.layers):
        x = x + _attention(layer.self_attn, layer.input_layernorm(x), cos, sin, caches, counts, masks, i, decode)
        x = x + layer.mlp(layer.post_attention_layernorm(x))
        if i in capture:
            captured[i] = x
    hidden = torch.cat([captured[i] for i in capture], dim=-1) if capture else None
    if logit_rows is not None:
        x = x.index_select(0, logit_rows)
    return model.lm_head(model.norm(x)), hidden


def _attention(attn: Attention, x, cos, sin, caches: list[KVCache], counts: list[int], masks,
               layer: int, decode: DecodeRows | None) -> torch.Tensor:
    N, D = x.shape[0], attn.head_dim
    q, k, v = attn.project(x, cos, sin)
    if decode is not None:
        return attn.o_proj(decode.attend(layer, q, k, v))
    out = torch.empty(N, attn.heads * D, dtype=x.dtype, device=x.device)
    for cache, rows, mask in zip(caches, row_slices(counts), masks):
        keys, values = cache.write(layer, k[rows].transpose(0, 1), v[rows].transpose(0, 1))  # [KV, L, D]
        out[rows] = attend(q[rows], keys, values, mask)
    return attn.o_proj(out)
