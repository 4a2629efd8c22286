"""PyTorch references written in the CUDA kernels' own calling conventions (keywords, layouts,
scale, l2norm flag, GVA head sharing, in-place conv state), so serving.models.gdn_ops' adapters
can be checked on CPU: adapter + reference must equal our direct PyTorch path. They are the
reference, reported as such; the real kernels are compared on a GPU by serving.bench.hybrid_cuda.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from serving.models.delta_rule import chunked_delta_rule, l2_normalise, recurrent_step
from serving.models.gdn_kernels import KernelChoice


def _prepare(q, k, v, g, beta, scale, initial_state, use_qk_l2norm_in_kernel):
    """fla: q, k [B, T, H, K] with H dividing HV; v [B, T, HV, V]; g, beta [B, T, HV]; state [B, HV, K, V]."""
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    q, k = q.float(), k.float()
    if use_qk_l2norm_in_kernel:
        q, k = l2_normalise(q), l2_normalise(k)
    q = q * (K ** -0.5 if scale is None else scale)
    q, k = (t.repeat_interleave(HV // H, dim=2) for t in (q, k))   # value head h reads key head h // (HV/H)
    state = initial_state.float() if initial_state is not None else q.new_zeros(B, HV, K, V)
    return q, k, v.float(), g.float(), beta.float(), state


def chunk_gated_delta_rule(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
                           use_qk_l2norm_in_kernel=False, cu_seqlens=None):
    q, k, v, g, beta, state = _prepare(q, k, v, g, beta, scale, initial_state, use_qk_l2norm_in_kernel)
    outs, finals = zip(*(chunked_delta_rule(q[b], k[b], v[b], g[b], beta[b], state[b]) for b in range(q.shape[0])))
    return torch.stack(outs), torch.stack(finals) if output_final_state else None


def fused_recurrent_gated_delta_rule(q, k, v, g=None, gk=None, gv=None, beta=None, scale=None, initial_state=None,
                                     output_final_state=False, use_qk_l2norm_in_kernel=False, cu_seqlens=None):
    q, k, v, g, beta, S = _prepare(q, k, v, g, beta, scale, initial_state, use_qk_l2norm_in_kernel)
    outs = []
    for t in range(q.shape[1]):   # every sequence of the batch advances one step at a time
        o, S = recurrent_step(q[:, t], k[:, t], v[:, t], g[:, t], beta[:, t], S)
        outs.append(o)
    return torch.stack(outs, dim=1), S if output_final_state else None


def causal_conv1d_fn(x, weight, bias=None, seq_idx=None, initial_states=None, return_final_states=False,
                     final_states_out=None, activation=None):
    """x [B, C, T], weight [C, W], initial_states [B, C, W-1] -> [B, C, T]."""
    width = weight.shape[1]
    past = initial_states if initial_states is not None else x.new_zeros(x.shape[0], x.shape[1], width - 1)
    out = F.conv1d(torch.cat([past, x], dim=-1), weight[:, None, :], bias, groups=weight.shape[0])
    return F.silu(out) if activation in ("silu", "swish") else out


def causal_conv1d_update(x, conv_state, weight, bias=None, activation=None, cache_seqlens=None,
                         conv_state_indices=None):
    """x [B, C], conv_state [B, C, S >= W-1] updated in place -> [B, C]."""
    width = weight.shape[1]
    full = torch.cat([conv_state, x[..., None]], dim=-1)            # [B, C, S + 1]
    conv_state.copy_(full[..., 1:])
    out = (full[..., -width:] * weight).sum(-1) + (bias if bias is not None else 0)
    return F.silu(out) if activation in ("silu", "swish") else out


REFERENCE = KernelChoice(chunk=chunk_gated_delta_rule, recurrent=fused_recurrent_gated_delta_rule,
                         conv_chain=causal_conv1d_fn, conv_step=causal_conv1d_update)
