"""One plain decode step through a `HybridLM` for B sequences at once: one new token each.

Projections, norms and MLPs run once over [B, hidden]. A Gated DeltaNet layer gathers the B
sequences' conv windows and recurrent states from their pool slots (a leading batch dimension:
the recurrence is per sequence and per head), advances them in one step (fla's fused recurrent
kernel and causal_conv1d_update where chosen) and writes them back to the same slots. A gated
full-attention layer attends as a dense decode batch does (serving.models.decode_attention:
the native kernel over the pool's rows in place, else one gather and SDPA call for the batch;
one sequence without the kernel attends on its own KV view). Each cache is marked
`advanced`; the caller commits its K/V row with `commit(1)`, as for a dense cache
(serving.engine.batch).
Prefill chunks and trees of a hybrid are not packed: `HybridLM.forward_packed` runs each
sequence's through its own `HybridLM.forward`, keeping its chunked or by-depth form.
"""

from __future__ import annotations

import torch

from serving.models.decode_attention import DecodeRows
from serving.models.hybrid_cache import HybridCache
from serving.models.llama import attend


@torch.inference_mode()
def decode_step(model, tokens: torch.Tensor, positions: torch.Tensor, caches: list[HybridCache],
                capture: tuple[int, ...] = ()) -> tuple[torch.Tensor, torch.Tensor | None]:
    """tokens, positions [B]; caches[b] sequence b's view of one pool (HybridPool).
    Returns logits [B, vocab] fp32 and hidden [B, len(capture) * hidden] or None."""
    x = model.embed(tokens)                                           # [B, hidden]
    cos, sin = model.cos.index_select(0, positions), model.sin.index_select(0, positions)
    conv, recurrent, slots = _stacked_states(caches, x.device)
    decode = DecodeRows.plan([c.kv for c in caches], x.dtype, x.device)
    captured = {}
    for i, layer in enumerate(model.layers):
        h = layer.input_layernorm(x)
        if layer.linear:
            n = layer.linear_attn.slot
            out, new_conv, new_state = layer.linear_attn.step(h, conv[slots, n], recurrent[slots, n], model.ops)
            conv[slots, n], recurrent[slots, n] = new_conv, new_state
        else:
            out = _attention(layer.self_attn, h, cos, sin, caches, decode)
        x = x + out
        x = x + layer.mlp(layer.post_attention_layernorm(x))
        if i in capture:
            captured[i] = x
    for cache in caches:
        cache.advanced = 1
    hidden = torch.cat([captured[i] for i in capture], dim=-1) if capture else None
    return model.lm_head(model.norm(x)), hidden


def _stacked_states(caches: list[HybridCache], device):
    """The pool's conv [slots, n, K-1, C] and recurrent [slots, n, H, dk, dv] tensors, and the
    slot of each sequence [B]. Every cache must be a view of that one pool."""
    base = caches[0]
    conv, recurrent = base.pool_conv, base.pool_recurrent
    if any(c.slot is None or c.pool_conv is not conv for c in caches):
        raise ValueError("a batched hybrid step needs every sequence's cache from one HybridPool")
    return conv, recurrent, torch.tensor([c.slot for c in caches], device=device)


def _attention(attn, x, cos, sin, caches: list[HybridCache], decode: DecodeRows | None) -> torch.Tensor:
    """x [B, hidden], one row per sequence -> [B, hidden]; each row's K/V written to its own view."""
    q, k, v, gate = attn.project(x, cos, sin)                          # q [B, H, D], k, v [B, KV, D]
    if decode is not None:
        return attn.output(decode.attend(attn.slot, q, k, v), gate)
    out = torch.empty(x.shape[0], q.shape[1] * q.shape[2], dtype=x.dtype, device=x.device)
    for b, cache in enumerate(caches):
        keys, values = cache.write(attn.slot, k[b, :, None], v[b, :, None])    # [KV, L, D]
        out[b] = attend(q[b:b + 1], keys, values, None)[0]
    return attn.output(out, gate)
