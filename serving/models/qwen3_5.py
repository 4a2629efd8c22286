"""HybridLM: the Qwen3.5/3.6 text model (Gated DeltaNet + gated full attention).

Same interface as `CausalLM` (docs/contracts.md section 3), with a HybridCache. Its forward is
one sequence's (its chunked or by-depth state form is per sequence): a packed forward runs each
sequence through it in turn, and a plain decode step of many sequences is one step for all
(serving.models.hybrid_batched). Layer i is
`linear_attention` (GatedDeltaNet) or `full_attention` (GatedAttention) per config.layer_types;
both are followed by the SwiGLU MLP. Every RMSNorm outside the DeltaNet output is zero-centred
(y = x_hat * (1 + w)). Tree rows (tree_mask) reach the linear layers as a tree too: each row's
recurrent and conv state derives from its ancestors only.
"""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F
from torch import nn

from serving.models.config import ModelConfig
from serving.models import gdn_kernels, gdn_ops, hybrid_batched
from serving.models.gated_deltanet import GatedDeltaNet
from serving.models.hybrid_cache import HybridCache
from serving.models.linear_rows import plan_rows
from serving.models.llama import MLP, TargetLM, attend, attention_mask
from serving.models.packing import row_slices
from serving.models.rope import apply_rope

class ZeroCentredRMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float, dtype: torch.dtype):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(dim, dtype=dtype))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        normed = F.rms_norm(x.float(), self.weight.shape, eps=self.eps)
        return (normed * (1.0 + self.weight.float())).to(x.dtype)


class GatedAttention(nn.Module):
    """GQA with per-head q/k norm, RoPE on the first rotary_dim dims, and a sigmoid output gate."""

    def __init__(self, c: ModelConfig, slot: int, dtype: torch.dtype):
        super().__init__()
        self.slot, self.heads, self.kv_heads, self.head_dim = slot, c.num_attention_heads, c.num_key_value_heads, c.head_dim
        self.rotary_dim = c.rotary_dim
        q_dim, kv_dim = self.heads * self.head_dim, self.kv_heads * self.head_dim
        self.splits = (2 * q_dim, kv_dim, kv_dim)   # q_proj rows: per head [query hd | gate hd]
        self.qkv_proj = nn.Linear(c.hidden_size, sum(self.splits), bias=c.attention_bias, dtype=dtype)
        self.o_proj = nn.Linear(q_dim, c.hidden_size, bias=False, dtype=dtype)
        self.q_norm = ZeroCentredRMSNorm(self.head_dim, c.rms_norm_eps, dtype)
        self.k_norm = ZeroCentredRMSNorm(self.head_dim, c.rms_norm_eps, dtype)

    def _rope(self, x, cos, sin):
        r = self.rotary_dim
        return torch.cat([apply_rope(x[..., :r], cos, sin), x[..., r:]], dim=-1)

    def project(self, x, cos, sin):
        """x [T, hidden] -> q [T, H, D], k, v [T, KV, D] (normed, rotated), gate [T, H * D]."""
        T, KV, D = x.shape[0], self.kv_heads, self.head_dim
        qg, k, v = self.qkv_proj(x).split(self.splits, dim=-1)
        q, gate = qg.view(T, self.heads, 2 * D).split(D, dim=-1)
        q, k = self.q_norm(q), self.k_norm(k.view(T, KV, D))
        q, k = self._rope(q, cos, sin), self._rope(k, cos, sin)
        return q, k, v.view(T, KV, D), gate.reshape(T, -1)

    def output(self, out, gate):
        """out [T, H * D] from attention -> [T, hidden] through the sigmoid gate."""
        return self.o_proj(out * torch.sigmoid(gate))

    def forward(self, x, ctx):
        q, k, v, gate = self.project(x, ctx.cos, ctx.sin)
        keys, values = ctx.cache.write(self.slot, k.transpose(0, 1), v.transpose(0, 1))
        return self.output(attend(q, keys, values, ctx.mask), gate)


class HybridLayer(nn.Module):
    def __init__(self, c: ModelConfig, index: int, dtype: torch.dtype):
        super().__init__()
        self.linear = c.layer_types[index] == "linear_attention"
        if self.linear:
            self.linear_attn = GatedDeltaNet(c, c.linear_layers.index(index), dtype)
        else:
            self.self_attn = GatedAttention(c, c.full_attention_layers.index(index), dtype)
        self.input_layernorm = ZeroCentredRMSNorm(c.hidden_size, c.rms_norm_eps, dtype)
        self.post_attention_layernorm = ZeroCentredRMSNorm(c.hidden_size, c.rms_norm_eps, dtype)
        self.mlp = MLP(c, dtype)

    def forward(self, x, ctx):
        h = self.input_layernorm(x)
        x = x + (self.linear_attn(h, ctx.cache, ctx.rows, ctx.ops) if self.linear else self.self_attn(h, ctx))
        return x + self.mlp(self.post_attention_layernorm(x))


class _Context:
    def __init__(self, cos, sin, mask, cache, rows, ops):
        self.cos, self.sin, self.mask, self.cache, self.rows, self.ops = cos, sin, mask, cache, rows, ops


class HybridLM(TargetLM):
    def __init__(self, config: ModelConfig, dtype: torch.dtype = torch.float32):
        layers = nn.ModuleList(HybridLayer(config, i, dtype) for i in range(config.num_hidden_layers))
        super().__init__(config, layers, ZeroCentredRMSNorm(config.hidden_size, config.rms_norm_eps, dtype),
                         config.rotary_dim, dtype)

    @property
    def ops(self) -> gdn_kernels.KernelChoice:
        """The Gated DeltaNet kernels for this model's device and dtype, chosen (and probed at
        its shapes) on first use."""
        if getattr(self, "_ops", None) is None:
            chosen = gdn_kernels.select(self.device, self.dtype)
            self._ops = gdn_ops.probe(chosen, self.config.linear, self.dtype, self.device)
        return self._ops

    @property
    def kernels(self) -> dict:
        return self.ops.report()

    def new_cache(self, capacity: int) -> HybridCache:
        return HybridCache(self.config, capacity, self.dtype, self.device)

    @torch.inference_mode()
    def forward(self, tokens, positions, cache: HybridCache, tree_mask=None, capture=(), last_only=False):
        """tokens, positions [T]; returns logits [T or 1, vocab] fp32 and hidden [T, len(capture) * H] or None.
        last_only: the caller reads the last row's logits only, so it commits all T rows (picking
        a prefix takes every row's logits); the cache then keeps nothing to commit fewer."""
        T = tokens.shape[0]
        x = self.embed(tokens)
        began = time.perf_counter()
        rows = plan_rows(T, tree_mask, self.config.linear.conv_kernel, x.device)
        cache.begin(rows, prefixes=not last_only)
        cache.state_seconds += time.perf_counter() - began
        ctx = _Context(self.cos.index_select(0, positions), self.sin.index_select(0, positions),
                       attention_mask(T, cache.length, tree_mask, self.config.kv_groups, x.device),
                       cache, rows, self.ops)
        captured = {}
        for i, layer in enumerate(self.layers):
            x = layer(x, ctx)
            if i in capture:
                captured[i] = x
        hidden = torch.cat([captured[i] for i in capture], dim=-1) if capture else None
        if last_only:
            x = x[-1:]
        return self.lm_head(self.norm(x)), hidden

    def forward_packed(self, tokens, positions, caches: list[HybridCache], counts: list[int], tree_masks=None,
                       capture=(), last_only=False):
        """As `CausalLM.forward_packed`, each sequence through its own forward in turn."""
        masks = tree_masks or [None] * len(caches)
        outs = [self.forward(tokens[own], positions[own], cache, mask, capture, last_only)
                for own, cache, mask in zip(row_slices(counts), caches, masks)]
        return torch.cat([o[0] for o in outs]), torch.cat([o[1] for o in outs]) if capture else None

    def decode_step(self, tokens, positions, caches: list[HybridCache], capture=()):
        """tokens, positions [B] (one new token per sequence) -> logits [B, vocab], hidden [B, ...] or None;
        every cache a view of one HybridPool."""
        return hybrid_batched.decode_step(self, tokens, positions, caches, capture)
