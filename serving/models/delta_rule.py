"""The gated delta rule (the recurrence of a Gated DeltaNet layer) in plain PyTorch.

Per value head h, with state S_h [dk, dv] in fp32:
    S_t = exp(g_t) (I - b_t k_t k_t^T) S_{t-1} + b_t k_t v_t^T,    o_t = S_t^T q_t
Three exact forms: `chunked_delta_rule` (a causal chain in chunks; prefill), `step_by_depth`
(every row of one tree depth at once, the state after every row kept; decode, verify, trees),
`recurrent_step` (one row for each of B sequences; batched decode). They are the CPU path and
the reference the CUDA kernels are tested against (serving.models.gdn_ops).
"""

from __future__ import annotations

import torch

from serving.models.linear_rows import Rows

CHUNK = 64


def l2_normalise(x: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + 1e-6)


def step_by_depth(q, k, v, g, beta, state: torch.Tensor, rows: Rows, step=None):
    """q, k [T, H, dk]; v [T, H, dv]; g, beta [T, H] (fp32); state [H, dk, dv]; step: the
    one-row-per-sequence op a depth advances by (`recurrent_step`'s signature; default it).

    Returns o [T, H, dv] and states [T + 1, H, dk, dv]: slot 0 the committed state, slot 1 + r
    the state after row r (given its ancestors only)."""
    step = step or recurrent_step
    T, H, dk = k.shape
    states = state.new_empty(T + 1, H, dk, v.shape[-1])
    states[0] = state
    out = v.new_empty(v.shape)
    for level, parents in zip(rows.levels, rows.level_parents):   # w rows of one depth at once
        out[level], states[rows.state_slots(level)] = step(
            q[level], k[level], v[level], g[level], beta[level], states[parents])
    return out, states


def recurrent_step(q, k, v, g, beta, states: torch.Tensor):
    """One new row for each of B sequences: q, k [B, H, dk]; v [B, H, dv]; g, beta [B, H];
    states [B, H, dk, dv] (each sequence's own). Returns o [B, H, dv] and the new states."""
    S = states * g.exp()[..., None, None]
    # delta rule: replace the value the state predicts for k by b * (v - S^T k)
    u = (v - torch.einsum("bhkv,bhk->bhv", S, k)) * beta[..., None]
    S = S + k[..., None] * u[..., None, :]
    return torch.einsum("bhkv,bhk->bhv", S, q), S


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
