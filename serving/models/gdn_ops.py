"""The Gated DeltaNet ops a forward calls, on the kernels `gdn_kernels.select` chose or in PyTorch.

Our layout is time-major per sequence: q, k [T, H, dk] already L2-normalised (q also scaled
by dk^-1/2) and repeated to the H value heads; v [T, H, dv]; g (log decay), beta [T, H] fp32;
recurrent state [H, dk, dv] fp32; conv inputs [K-1 + T, C] (committed columns, then new rows).
The kernels take fla's [B, T, H, K] with state [N, H, K, V] (the same K x V orientation) and
causal-conv1d's channels-first [B, C, T]; the adapters below reshape to and from those, call
every kernel by keyword, pass scale 1 and use_qk_l2norm_in_kernel False (our q, k arrive
normalised and scaled), and return fp32 outputs and states in our layout. Tests run the same
adapters over PyTorch references written in the kernels' conventions (tests/hybrid).
`probe` is the last capability check: each chosen kernel once at the model's shapes beside
PyTorch, kept only when it runs and agrees.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from serving.models.delta_rule import chunked_delta_rule, l2_normalise, recurrent_step
from serving.models.gdn_kernels import KernelChoice


def chain_delta_rule(choice: KernelChoice, q, k, v, g, beta, state, dtype: torch.dtype):
    """A causal chain from `state`: o [T, H, dv] fp32 and the final state [H, dk, dv] fp32.
    dtype: what the kernel computes in (the model's; fla's chunked kernel refuses fp32)."""
    if choice.chunk is None:
        return chunked_delta_rule(q, k, v, g, beta, state)
    o, final = choice.chunk(q=q[None].to(dtype), k=k[None].to(dtype), v=v[None].to(dtype), g=g[None],
                            beta=beta[None].to(dtype), scale=1.0, initial_state=state[None].contiguous(),
                            output_final_state=True, use_qk_l2norm_in_kernel=False)
    return o[0].float(), final[0].float()


def step_delta_rule(choice: KernelChoice, q, k, v, g, beta, states):
    """One new row per sequence (B of them, shapes as our layout with T -> B); states [B, H, dk, dv].
    Returns o [B, H, dv] fp32 and the new states [B, H, dk, dv] fp32."""
    if choice.recurrent is None:
        return recurrent_step(q, k, v, g, beta, states)
    o, final = choice.recurrent(q=q[:, None], k=k[:, None], v=v[:, None], g=g[:, None], beta=beta[:, None],
                                scale=1.0, initial_state=states.contiguous(), output_final_state=True,
                                use_qk_l2norm_in_kernel=False)
    return o[:, 0].float(), final.float()


def chain_conv(choice: KernelChoice, inputs: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """inputs [K-1 + T, C], weight [C, K] -> silu(causal depthwise conv) of the T new rows, [T, C]."""
    past = weight.shape[1] - 1
    if choice.conv_chain is None:
        return F.silu(F.conv1d(inputs.T[None], weight[:, None, :], groups=weight.shape[0])[0].T)
    # [1, C, T] and [1, C, K-1] views of time-major storage: channels are the contiguous dim,
    # the channel-last layout causal_conv1d_fn takes initial states in
    out = choice.conv_chain(x=inputs[past:].T[None], weight=weight, bias=None,
                            initial_states=inputs[:past].T[None], return_final_states=False, activation="silu")
    return out[0].T


def step_conv(choice: KernelChoice, window: torch.Tensor, x: torch.Tensor,
              weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """window [B, K-1, C] (each sequence's committed conv inputs), x [B, C] -> silu(conv) [B, C]
    and the window after x, [B, K-1, C]: one concatenation either way (PyTorch convolves
    [window ; x] and keeps its last K-1 rows). The kernel's in-place update of its own copy is
    discarded, so a staged (uncommitted) step never touches the committed state."""
    if choice.conv_step is None:
        full = torch.cat([window, x[:, None]], dim=1)                   # [B, K, C]
        return F.silu(torch.einsum("bkc,ck->bc", full, weight)), full[:, 1:]
    state = window.transpose(1, 2).contiguous()                         # [B, C, K-1]
    out = choice.conv_step(x=x, conv_state=state, weight=weight, bias=None, activation="silu")
    return out, torch.cat([window[:, 1:], x[:, None]], dim=1)


PROBE_ROWS = 70        # two chunks of the chunked kernel, the second partial
PROBE_TOLERANCE = {torch.float32: 1e-4, torch.float16: 2e-2, torch.bfloat16: 5e-2}   # of max |reference|


def probe(choice: KernelChoice, linear, dtype: torch.dtype, device) -> KernelChoice:
    """Each chosen kernel run once at the model's head shapes (`linear`: its LinearAttention
    config) beside PyTorch; one that fails or disagrees (a shape it cannot take, a changed
    convention its signature does not show) is dropped, and `why_torch` says so."""
    ops = {f: getattr(choice, f) for f in ("chunk", "recurrent", "conv_chain", "conv_step")}
    if all(fn is None for fn in ops.values()):
        return choice
    runs = op_cases(linear, dtype, device)
    kept, why = {}, [choice.why_torch] if choice.why_torch else []
    for field, fn in ops.items():
        kept[field] = fn
        if fn is None:
            continue
        try:
            error = relative_error(runs[field](KernelChoice(**{field: fn})), runs[field](KernelChoice()))
        except Exception as e:   # the kernel cannot take these shapes here: PyTorch runs it
            kept[field] = None
            why.append(f"{field} kernel failed its probe ({type(e).__name__}: {e})"[:200])
            continue
        if not error <= PROBE_TOLERANCE[dtype]:
            kept[field] = None
            why.append(f"{field} kernel differs from PyTorch by {error:.3g} of the output's scale")
    return KernelChoice(**kept, why_torch="; ".join(why))


def relative_error(got: tuple, ref: tuple) -> float:
    """Largest |got - ref| over outputs, as a share of that output's max |ref|."""
    return max(float((a.float() - b.float()).abs().max() / b.float().abs().max().clamp_min(1e-6))
               for a, b in zip(got, ref))


def op_cases(linear, dtype: torch.dtype, device, rows: int = PROBE_ROWS, batch: int = 2) -> dict:
    """Per op (a KernelChoice field), a call on fixed random inputs at these head shapes,
    taking the choice and returning a tuple of tensors: chains of `rows` rows, steps of
    `batch` sequences (rows > batch). The probe's inputs; serving.bench.hybrid_cuda times them."""
    gen = torch.Generator(device).manual_seed(0)
    H, dk, dv, K, T = (linear.num_value_heads, linear.key_head_dim, linear.value_head_dim, linear.conv_kernel, rows)

    def rand(*shape, dt=torch.float32):
        return torch.randn(*shape, generator=gen, device=device).to(dt)

    q, k = l2_normalise(rand(T, H, dk)) * dk ** -0.5, l2_normalise(rand(T, H, dk))
    v, g, beta = rand(T, H, dv), -rand(T, H).sigmoid(), rand(T, H).sigmoid()
    state = rand(H, dk, dv) * 0.1
    inputs, weight = rand(K - 1 + T, linear.conv_dim, dt=dtype), rand(linear.conv_dim, K, dt=dtype)
    window = torch.stack([inputs[i:i + K - 1] for i in range(batch)])   # `batch` sequences' windows
    return {"chunk": lambda c: chain_delta_rule(c, q, k, v, g, beta, state, dtype),
            "recurrent": lambda c: step_delta_rule(c, q[:batch], k[:batch], v[:batch], g[:batch], beta[:batch],
                                                   state.expand(batch, -1, -1, -1)),
            "conv_chain": lambda c: (chain_conv(c, inputs, weight),),
            "conv_step": lambda c: step_conv(c, window, inputs[K:K + batch], weight)[:1]}
