"""Products of fp32 rows with bf16 weights on CPU, the weights in a blocked layout packed once.

A decode step streams every weight once, so on CPU its time is the bytes of the weights over
the bandwidth a core reads at; bf16 weights halve the bytes. oneDNN's packed bf16 product
(serving.models.cpu_gemm) read SmolLM2's layers at 10 GB/s at one row on this project's 2-core
AMD EPYC (avx512_bf16, no AMX), where one core sums memory at 15.8-18.7 GB/s. This kernel
(linear_bf16.c) lays each weight out so a product reads it front to back in one stream, 64
columns x a pair of k per 256-byte step, and multiplies with VDPBF16PS: the layers' products
took 16.0 / 15.5 / 18.8 / 28.4 ms at 1 / 4 / 8 / 16 rows against oneDNN's 24.1 / 21.4 / 24.8 /
30.7 (one core, interleaved, medians of 6; `python -m serving.bench.products`). Software
prefetching made it slower (18.1-23.5 ms at one row), so it has none.

Inputs are fp32 rows (what a bf16 target computes in: serving.contract.runtime.compute_dtype),
rounded to bf16 in the kernel; outputs fp32, unrounded. Used only for inference, on CPU, when
the library built and agreed with F.linear of the bf16-rounded inputs on a probe; `available`
says so.
"""

from __future__ import annotations

import ctypes
import functools

import torch
import torch.nn.functional as F

from serving.kernels import build

_I64, _PTR = ctypes.c_int64, ctypes.c_void_p
GROUP = 64                 # columns per block (linear_bf16.c)
PROBE_TOLERANCE = 1e-4     # of max |reference|: fp32 sums in another order


@functools.cache
def _library():
    return build.function("linear_bf16", "ddops_linear_bf16", ctypes.c_int,
                          [_PTR, _I64, _I64, _PTR, _I64, _I64, _PTR, _PTR, _I64, _I64, ctypes.c_int], _probe,
                          "F.linear of bf16-rounded inputs")


@functools.cache
def _packer():
    lib, _ = build.load("linear_bf16")
    fn = lib.ddops_pack_bf16
    fn.restype, fn.argtypes = None, [_PTR, _I64, _I64, _PTR]
    return fn


def available(device) -> tuple[bool, str]:
    """(True, "") when bf16 weights on this device run on the kernel (built and probed now, so a
    server pays the build at start), else (False, why)."""
    if torch.device(device).type != "cpu":
        return False, f"the kernel is for CPU, not {device}"
    lib, why = build.load("linear_bf16")
    if lib is None:
        return False, why
    lib.ddops_linear_bf16_native.restype = ctypes.c_int
    if not lib.ddops_linear_bf16_native():
        return False, "this CPU has no AVX512_BF16 (VDPBF16PS): oneDNN runs bf16 weights"
    fn, why = _library()
    return fn is not None, why


def blocked_shape(n: int, k: int) -> tuple[int, int, int, int]:
    """[ceil(N / 64), ceil(K / 2), 64, 2]: N padded with zero rows to 64, K with a zero column to even."""
    return (-(-n // GROUP), -(-k // 2), GROUP, 2)


def is_blocked(t: torch.Tensor) -> bool:
    """`t` is a weight `pack` made (4-D bf16; dense weights are 2-D, oneDNN's packed ones opaque)."""
    return not t.is_mkldnn and t.dim() == 4 and t.dtype == torch.bfloat16


def pack(weight: torch.Tensor) -> torch.Tensor:
    """A bf16 [N, K] matrix in the kernel's blocked layout (a new tensor; the matrix is not kept)."""
    weight = weight.detach().contiguous()
    n, k = weight.shape
    blocked = torch.empty(blocked_shape(n, k), dtype=torch.bfloat16)
    _packer()(weight.data_ptr(), n, k, blocked.data_ptr())
    return blocked


def product(rows: torch.Tensor, blocked: torch.Tensor, n: int, bias: torch.Tensor | None = None,
            min_rows: int = 1, fn=None) -> torch.Tensor:
    """rows [..., K] @ the packed [n, K] weight -> [..., n], in rows' dtype (fp32 sums; bf16 rows
    are widened for the kernel and the result rounded back); fewer than `min_rows` rows run
    padded with zero rows inside the kernel."""
    fn = fn or _library()[0]
    lead, k = rows.shape[:-1], rows.shape[-1]                 # [..., K] runs as rows [M, K]
    x = rows.reshape(-1, k)
    x = x if x.dtype == torch.float32 and x.stride(-1) == 1 else x.float().contiguous()
    m = x.shape[0]
    b = None if bias is None else bias.float().contiguous()
    out = torch.empty(m, n, dtype=torch.float32)
    if fn(x.data_ptr(), m, x.stride(0), blocked.data_ptr(), n, k, None if b is None else b.data_ptr(),
          out.data_ptr(), n, min_rows, torch.get_num_threads()):
        raise MemoryError("linear_bf16: no memory for the rounded input rows")
    out = out.view(*lead, n)
    return out if rows.dtype == torch.float32 else out.to(rows.dtype)


def _probe(fn) -> bool:
    gen = torch.Generator().manual_seed(0)
    for n, k in ((70, 33), (128, 64)):          # a partial block and an odd K; whole blocks
        w, x = torch.randn(n, k, generator=gen).bfloat16(), torch.randn(3, k, generator=gen)
        bias = torch.randn(n, generator=gen)
        got = product(x, pack(w), n, bias, 4, fn)
        want = F.linear(x.bfloat16().float(), w.float(), bias)
        if not (got - want).abs().max() <= PROBE_TOLERANCE * want.abs().max():
            return False
    return True
