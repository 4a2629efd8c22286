"""RMSNorm of fp32 rows on CPU in one native call.

`F.rms_norm` on CPU runs as several elementwise kernels and cost 8.5-10 us a call at [1-16, 576]
on this project's machine (`F.layer_norm`, one fused kernel, 2.4-4.6 us); a SmolLM2 decode step
makes 61 such calls, about a twentieth of a one-stream step. vLLM 0.32 on CPU runs the norm as
PyTorch operations (`RMSNorm.forward_native` in vllm/model_executor/layers/layernorm.py; its C
kernel in vllm/kernels/vllm_c.py is registered for GPU-like devices only), which its default
torch.compile fuses into one loop. Used only for inference (no backward: a caller that needs
gradients keeps `F.rms_norm`), on fp32 CPU tensors, when the kernel built and agreed with
`F.rms_norm` on a probe; `usable` says so per tensor.
"""

from __future__ import annotations

import ctypes
import functools

import torch
import torch.nn.functional as F

from serving.kernels import build

_I64, _PTR = ctypes.c_int64, ctypes.c_void_p
PROBE_TOLERANCE = 1e-5


@functools.cache
def _library():
    return build.function("rms_norm", "ddops_rms_norm_f32", None,
                          [_PTR, _I64, _I64, _I64, _I64, _PTR, _I64, ctypes.c_float, _PTR], _probe, "F.rms_norm")


def available(dtype: torch.dtype, device: torch.device) -> tuple[bool, str]:
    """(True, "") when a model of this dtype on this device normalises natively (built and
    probed now, so a server pays the build at start, not on its first request), else (False, why)."""
    return build.serves(_library(), dtype, device)


def usable(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """weight: contiguous [H], as a model's norm weight is."""
    return (x.dtype == torch.float32 and x.device.type == "cpu" and weight.dtype == torch.float32
            and not (torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad))
            and _library()[0] is not None)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, fn=None) -> torch.Tensor:
    """x [..., H] -> a new contiguous tensor of x's shape. A call costs about what its Python
    takes (a few us), so the common layouts pass their strides without a reshape."""
    fn = fn or _library()[0]
    H = x.shape[-1]
    if x.dim() == 2 and x.stride(1) == 1:                 # [T, hidden] activations
        outer, outer_stride, inner, inner_stride = x.shape[0], x.stride(0), 1, 0
    elif x.dim() == 3 and x.stride(2) == 1:               # [T, heads, D] views of a projection
        outer, outer_stride, inner, inner_stride = x.shape[0], x.stride(0), x.shape[1], x.stride(1)
    else:
        x = x.contiguous()
        outer, outer_stride, inner, inner_stride = x.numel() // H, H, 1, 0
    out = torch.empty_like(x, memory_format=torch.contiguous_format)
    fn(x.data_ptr(), outer, outer_stride, inner, inner_stride, weight.data_ptr(), H, eps, out.data_ptr())
    return out


def _probe(fn) -> bool:
    gen = torch.Generator().manual_seed(0)
    x, w = torch.randn(3, 5, 40, generator=gen)[:, 1:4], torch.randn(40, generator=gen)
    got = rms_norm(x, w, 1e-6, fn)
    return torch.allclose(got, F.rms_norm(x, (40,), w, 1e-6), atol=PROBE_TOLERANCE, rtol=PROBE_TOLERANCE)
