"""Gated DeltaNet, the linear-attention layer of Qwen3.5/3.6: short causal conv + gated delta rule.

Per value head h (reading key head h // (Hv / Hk)), with state S_h [dk, dv] in fp32:
    S_t = exp(g_t) (I - b_t k_t k_t^T) S_{t-1} + b_t k_t v_t^T,    o_t = S_t^T q_t
q, k are L2-normalised (q also scaled by dk^-1/2), b = sigmoid(in_proj_b x),
g = -exp(A_log) softplus(in_proj_a x + dt_bias) <= 0. Output: out_proj(w * rmsnorm(o) * silu(z)).

The recurrence's forms live in serving.models.delta_rule: prefill chains run chunked (only the
final state comes out; fla's chunked kernel on CUDA where chosen), verify chains and draft trees
by depth (the state after every row kept, so the cache can commit any row), one new token by
the recurrent step (fla's fused recurrent kernel where chosen). `forward` serves one sequence
(its HybridCache); `step` serves B sequences one token each, their states stacked.
"""

from __future__ import annotations

from functools import partial

import torch
import torch.nn.functional as F
from torch import nn

from serving.models import gdn_ops
from serving.models.config import ModelConfig
from serving.models.delta_rule import l2_normalise, step_by_depth
from serving.models.gdn_kernels import TORCH, KernelChoice
from serving.models.linear_rows import Rows


class GatedRMSNorm(nn.Module):
    """Per value head: w * rmsnorm(o) * silu(z) (normalised in fp32, as the HF reference)."""

    def __init__(self, dim: int, eps: float, dtype: torch.dtype):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim, dtype=dtype))
        self.eps = eps

    def forward(self, o: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        of = o.float()
        of = of * torch.rsqrt(of.pow(2).mean(-1, keepdim=True) + self.eps)
        return (self.weight * of.to(o.dtype) * F.silu(z.float())).to(o.dtype)


class GatedDeltaNet(nn.Module):
    """One linear-attention mixer; `slot` indexes its conv/recurrent state in the HybridCache."""

    def __init__(self, c: ModelConfig, slot: int, dtype: torch.dtype):
        super().__init__()
        L = c.linear
        self.slot, self.L = slot, L
        self.key_dim = L.num_key_heads * L.key_head_dim
        # in_proj_qkv | in_proj_z | in_proj_b | in_proj_a, fused at load (one matmul per token)
        self.splits = (L.conv_dim, L.value_dim, L.num_value_heads, L.num_value_heads)
        self.in_proj = nn.Linear(c.hidden_size, sum(self.splits), bias=False, dtype=dtype)
        self.conv_weight = nn.Parameter(torch.empty(L.conv_dim, L.conv_kernel, dtype=dtype))  # [C, K]
        self.A_log = nn.Parameter(torch.empty(L.num_value_heads, dtype=dtype))
        self.dt_bias = nn.Parameter(torch.empty(L.num_value_heads, dtype=dtype))
        self.norm = GatedRMSNorm(L.value_head_dim, c.rms_norm_eps, dtype)
        self.out_proj = nn.Linear(L.value_dim, c.hidden_size, bias=False, dtype=dtype)

    def forward(self, x: torch.Tensor, cache, rows: Rows, ops: KernelChoice) -> torch.Tensor:
        """x [T, hidden] -> [T, hidden]; stages every row's state in `cache` (committed later)."""
        T = x.shape[0]
        mixed, z, b, a = self.in_proj(x).split(self.splits, dim=-1)
        inputs = torch.cat([cache.conv[self.slot], mixed])              # [K-1 + T, C] oldest first
        if rows.window is None:   # a causal chain: the plain depthwise conv
            conv = gdn_ops.chain_conv(ops, inputs, self.conv_weight)
        else:                     # each row convolves its own ancestors' inputs
            conv = F.silu(torch.einsum("tkc,ck->tc", inputs[rows.window], self.conv_weight))
        q, k, v, g, beta = self._heads(conv, b, a)
        state = cache.recurrent[self.slot]
        if rows.stepwise:
            # one new token: the decode step op (a kernel where chosen); verify chains and trees: PyTorch
            step = partial(gdn_ops.step_delta_rule, ops if T == 1 else TORCH)
            o, states = step_by_depth(q, k, v, g, beta, state, rows, step)
            cache.stage(self.slot, inputs, states)
        else:
            o, states = gdn_ops.chain_delta_rule(ops, q, k, v, g, beta, state, x.dtype)
            cache.stage(self.slot, inputs, states, replay=(k, v, g, beta))
        return self._output(o, z)

    def step(self, x: torch.Tensor, conv: torch.Tensor, recurrent: torch.Tensor, ops: KernelChoice):
        """One new token for each of B sequences: x [B, hidden]; conv [B, K-1, C] and recurrent
        [B, H, dk, dv] their committed states. Returns out [B, hidden], the new conv and recurrent states."""
        mixed, z, b, a = self.in_proj(x).split(self.splits, dim=-1)
        out, window = gdn_ops.step_conv(ops, conv, mixed, self.conv_weight)
        q, k, v, g, beta = self._heads(out, b, a)
        o, after = gdn_ops.step_delta_rule(ops, q, k, v, g, beta, recurrent)
        return self._output(o, z), window, after

    def _heads(self, conv, b, a):
        """conv [T, C] (after silu), b, a [T, Hv] -> q, k [T, Hv, dk] (normalised, q scaled),
        v [T, Hv, dv], g, beta [T, Hv], all fp32."""
        L, T = self.L, conv.shape[0]
        q, k, v = conv.split((self.key_dim, self.key_dim, L.value_dim), dim=-1)
        repeat = L.num_value_heads // L.num_key_heads
        q = l2_normalise(q.float().view(T, L.num_key_heads, -1)).repeat_interleave(repeat, 1)
        k = l2_normalise(k.float().view(T, L.num_key_heads, -1)).repeat_interleave(repeat, 1)
        q = q * L.key_head_dim ** -0.5
        v = v.float().view(T, L.num_value_heads, -1)
        g = -self.A_log.float().exp() * F.softplus(a.float() + self.dt_bias.float())
        return q, k, v, g, b.sigmoid().float()

    def _output(self, o: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        """o [T, Hv, dv] fp32, z [T, Hv * dv] -> [T, hidden]."""
        L, T = self.L, o.shape[0]
        o = self.norm(o.to(z.dtype), z.view(T, L.num_value_heads, -1))
        return self.out_proj(o.reshape(T, L.value_dim))
