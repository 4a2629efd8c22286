"""Gated DeltaNet, the linear-attention layer of Qwen3.5/3.6: short causal conv + gated delta rule.

Per value head h (reading key head h // (Hv / Hk)), with state S_h [dk, dv] in fp32:
    S_t = exp(g_t) (I - b_t k_t k_t^T) S_{t-1} + b_t k_t v_t^T,    o_t = S_t^T q_t
q, k are L2-normalised (q also scaled by dk^-1/2), b = sigmoid(in_proj_b x),
g = -exp(A_log) softplus(in_proj_a x + dt_bias) <= 0. Output: out_proj(w * rmsnorm(o) * silu(z)).

Two exact forms of the same recurrence:
- chunked (`chunked_delta_rule`): a causal chain in chunks of 64 rows (triangular solve + matmuls);
  only the final state comes out. Used for prefill.
- by depth (`step_by_depth`): every row of one tree depth advances at once from its parent's
  state; the state after every row is kept, so the cache can commit any row. Used for decode,
  verify chains and draft trees (a chain is a tree of one row per depth).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from serving.models.config import ModelConfig
from serving.models.linear_rows import Rows

CHUNK = 64


def l2_normalise(x: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + 1e-6)


def step_by_depth(q, k, v, g, beta, state: torch.Tensor, rows: Rows):
    """q, k [T, H, dk]; v [T, H, dv]; g, beta [T, H] (fp32); state [H, dk, dv].

    Returns o [T, H, dv] and states [T + 1, H, dk, dv]: slot 0 the committed state, slot 1 + r
    the state after row r (given its ancestors only)."""
    T, H, dk = k.shape
    states = state.new_empty(T + 1, H, dk, v.shape[-1])
    states[0] = state
    out = v.new_empty(v.shape)
    decay = g.exp()[..., None, None]                      # [T, H, 1, 1]
    kv_scale = beta[..., None]                            # [T, H, 1]
    for level, parents in zip(rows.levels, rows.level_parents):
        S = states[parents] * decay[level]                # [w, H, dk, dv]
        kl = k[level]
        # delta rule: replace the value the state predicts for k by b * (v - S^T k)
        u = (v[level] - torch.einsum("whkv,whk->whv", S, kl)) * kv_scale[level]
        S = S + kl[..., None] * u[..., None, :]
        out[level] = torch.einsum("whkv,whk->whv", S, q[level])
        states[rows.state_slots(level)] = S
    return out, states


def chunked_delta_rule(q, k, v, g, beta, state: torch.Tensor, chunk: int = CHUNK):
    """The same recurrence over a causal chain, chunk by chunk. Shapes as `step_by_depth`.

    Within a chunk (G = cumsum g, D_ij = exp(G_i - G_j) for j <= i): with A = I + strict-lower
    part of b_i (k_i . k_j) D_ij, U = A^-1 (b v) and W = A^-1 (b exp(G) k); then
    V' = U - W S, O = (exp(G) q) S + (q k^T * D) V', S <- exp(G_last) S + (exp(G_last - G) k)^T V'.
    Returns o [T, H, dv] and the final state [H, dk, dv]."""
    q, k, v, g, beta = (t.transpose(0, 1) for t in (q, k, v, g, beta))   # heads first
    out = v.new_empty(v.shape)
    S = state
    for s in range(0, k.shape[1], chunk):
        c = slice(s, s + chunk)
        qc, kc, vc, bc = q[:, c], k[:, c], v[:, c], beta[:, c]
        G = g[:, c].cumsum(-1)                                          # [H, n]
        n = G.shape[-1]
        lower = torch.ones(n, n, dtype=torch.bool, device=G.device).tril()
        D = torch.where(lower, G[:, :, None] - G[:, None, :], float("-inf")).exp()   # [H, n, n]
        A = (bc[..., None] * (kc @ kc.transpose(-1, -2))) * D           # diagonal ignored below
        U = torch.linalg.solve_triangular(A, bc[..., None] * vc, upper=False, unitriangular=True)
        W = torch.linalg.solve_triangular(A, (bc * G.exp())[..., None] * kc, upper=False, unitriangular=True)
        Vp = U - W @ S                                                  # [H, n, dv]
        out[:, c] = (qc * G.exp()[..., None]) @ S + ((qc @ kc.transpose(-1, -2)) * D) @ Vp
        tail = G[:, -1:]                                                # [H, 1]
        S = tail.exp()[..., None] * S + (kc * (tail - G).exp()[..., None]).transpose(-1, -2) @ Vp
    return out.transpose(0, 1), S


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

    def forward(self, x: torch.Tensor, cache, rows: Rows) -> torch.Tensor:
        """x [T, hidden] -> [T, hidden]; stages every row's state in `cache` (committed later)."""
        L, T = self.L, x.shape[0]
        mixed, z, b, a = self.in_proj(x).split(self.splits, dim=-1)
        inputs = torch.cat([cache.conv[self.slot], mixed])              # [K-1 + T, C] oldest first
        if rows.window is None:   # a causal chain: the plain depthwise conv
            conv = F.conv1d(inputs.T[None], self.conv_weight[:, None, :], groups=L.conv_dim)[0].T
        else:                     # each row convolves its own ancestors' inputs
            conv = torch.einsum("tkc,ck->tc", inputs[rows.window], self.conv_weight)
        q, k, v = F.silu(conv).split((self.key_dim, self.key_dim, L.value_dim), dim=-1)
        repeat = L.num_value_heads // L.num_key_heads
        q = l2_normalise(q.float().view(T, L.num_key_heads, -1)).repeat_interleave(repeat, 1)
        k = l2_normalise(k.float().view(T, L.num_key_heads, -1)).repeat_interleave(repeat, 1)
        q = q * L.key_head_dim ** -0.5
        v = v.float().view(T, L.num_value_heads, -1)
        beta = b.sigmoid().float()
        g = -self.A_log.float().exp() * F.softplus(a.float() + self.dt_bias.float())
        state = cache.recurrent[self.slot]
        if rows.stepwise:
            o, states = step_by_depth(q, k, v, g, beta, state, rows)
            cache.stage(self.slot, inputs, states)
        else:
            o, states = chunked_delta_rule(q, k, v, g, beta, state)
            cache.stage(self.slot, inputs, states, replay=(q, k, v, g, beta))
        o = self.norm(o.to(x.dtype), z.view(T, L.num_value_heads, -1))
        return self.out_proj(o.reshape(T, L.value_dim))
