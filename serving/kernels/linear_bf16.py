"""Products of fp32 rows with bf16 weights on CPU, the weights in a blocked layout packed once.

A decode step streams every weight once, so on CPU its time is the bytes of the weights over
the bandwidth a core reads at; bf16 weights halve the bytes. oneDNN's packed bf16 product
(serving.models.cpu_gemm) read SmolLM2's layers at 10 GB/s at one row on this project's 2-core
AMD EPYC (avx512_bf16, no AMX), where one core sums memory at 15.8-18.7 GB/s. This kernel
(linear_bf16.c) lays each weight out so a product reads it front to back in one stream, 32
columns x a pair of k per 128-byte step, and multiplies with VDPBF16PS: with 64-column groups the
layers' products took 16.0 / 15.5 / 18.8 / 28.4 ms at 1 / 4 / 8 / 16 rows against oneDNN's
24.1 / 21.4 / 24.8 / 30.7 (one core, interleaved, medians of 6; `python -m
serving.bench.products`); 32-column groups, which let 8 rows share one pass, made 8 and 16 rows
a further 10-25 % faster (linear_bf16.c has the figures). Software prefetching made it slower
(18.1-23.5 ms at one row), so it has none. A model's packed weights lie in one `arena` on huge
pages, which is what let the stream reach the core's bandwidth (its docstring has the figures).

The RMSNorm before a projection, the SwiGLU before the down projection, the residual add after
a projection and the RoPE after the q/k/v projection run inside the product's call (`product`'s
norm, swiglu, residual and rope; cpu_gemm.Linear.fused): one call, one tensor and one pass over
the rows fewer for each. On SmolLM2's decode step the first three were within the runs' noise
and the RoPE about 1 ms of 15 at one row (docs/serving.md "bf16 on CPU").

Inputs are fp32 rows (what a bf16 target computes in: serving.contract.runtime.compute_dtype),
rounded to bf16 in the kernel; outputs fp32, unrounded. Used only for inference, on CPU, when
the library built and agreed with F.linear of the bf16-rounded inputs on a probe; `available`
says so.
"""

from __future__ import annotations

import ctypes
import functools
import mmap

import torch
import torch.nn.functional as F

from serving.kernels import build

_I64, _PTR = ctypes.c_int64, ctypes.c_void_p
GROUP = 32                 # columns per block (linear_bf16.c)
PROBE_TOLERANCE = 1e-4     # of max |reference|: fp32 sums in another order
HUGE_PAGE = 2 << 20        # the x86-64 transparent huge page


@functools.cache
def _library():
    return build.function("linear_bf16", "ddops_linear_bf16", ctypes.c_int,
                          [_PTR, _I64, _I64, _PTR, _I64, _I64, _PTR, _PTR, ctypes.c_float, ctypes.c_int, _PTR, _I64,
                           _PTR, _PTR, _I64, _I64, _PTR, _I64, _I64, ctypes.c_int], _probe,
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
    """[ceil(N / 32), ceil(K / 2), 32, 2]: N padded with zero rows to 32, K with a zero column to even."""
    return (-(-n // GROUP), -(-k // 2), GROUP, 2)


def is_blocked(t: torch.Tensor) -> bool:
    """`t` is a weight `pack` made (4-D bf16; dense weights are 2-D, oneDNN's packed ones opaque)."""
    return not t.is_mkldnn and t.dim() == 4 and t.dtype == torch.bfloat16


def pack(weight: torch.Tensor, into: torch.Tensor | None = None) -> torch.Tensor:
    """A bf16 [N, K] matrix in the kernel's blocked layout: `into` (a contiguous bf16 tensor of
    blocked_shape, such as a slice of an `arena`) or a new tensor; the matrix is not kept."""
    weight = weight.detach().contiguous()
    n, k = weight.shape
    blocked = torch.empty(blocked_shape(n, k), dtype=torch.bfloat16) if into is None else into
    if tuple(blocked.shape) != blocked_shape(n, k) or blocked.dtype != torch.bfloat16 or not blocked.is_contiguous():
        raise ValueError(f"pack: {tuple(blocked.shape)} {blocked.dtype} is not the blocked {blocked_shape(n, k)} bf16")
    _packer()(weight.data_ptr(), n, k, blocked.data_ptr())
    return blocked


def arena(elements: int) -> torch.Tensor:
    """A flat bf16 tensor of `elements` for packed weights, on anonymous memory starting at a
    2 MiB boundary that the OS is asked to back with transparent huge pages (madvise
    MADV_HUGEPAGE, before anything touches it; where the OS has no such advice, ordinary pages).

    A product streams its weight front to back, and on 4 KiB pages the stream pays a page walk
    each 4 KiB and the hardware prefetcher stops at each page's end: on this project's EPYC a
    one-thread pass over 256 MiB read 15-17 GB/s on 4 KiB pages and 23-28 GB/s on huge pages
    (the kernel's own VDPBF16PS loop alike; a C loop, three runs each)."""
    if elements == 0:
        return torch.empty(0, dtype=torch.bfloat16)
    memory = mmap.mmap(-1, elements * 2 + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)  # (shared: no THP)
    if hasattr(mmap, "MADV_HUGEPAGE"):
        memory.madvise(mmap.MADV_HUGEPAGE)
    view = ctypes.c_char.from_buffer(memory)
    start = ctypes.addressof(view)
    del view                                              # a live export would pin the mapping
    return torch.frombuffer(memory, dtype=torch.bfloat16, count=elements, offset=-start % HUGE_PAGE)


def product(rows: torch.Tensor, blocked: torch.Tensor, n: int, bias: torch.Tensor | None = None,
            min_rows: int = 1, fn=None, *, norm: tuple[torch.Tensor, float] | None = None, swiglu: bool = False,
            residual: torch.Tensor | None = None, rope: tuple[torch.Tensor, torch.Tensor, int] | None = None
            ) -> torch.Tensor:
    """rows [..., K] @ the packed [n, K] weight (+ bias) -> [..., n], in rows' dtype (fp32 sums;
    bf16 rows are widened for the kernel and the result rounded back); fewer than `min_rows` rows
    run padded with zero rows inside the kernel. Fused around the product, each optional:
    norm = (weight [K], eps): each row RMS-normalised first; swiglu: rows are [..., 2K], gate
    then up, and the input is silu(gate) * up; residual [..., n]: added to the result;
    rope = (cos, sin [M, D], heads): the result's first `heads` heads of D rotated after
    (rotate-half, as serving.models.rope.apply_rope)."""
    fn = fn or _library()[0]
    lead, width = rows.shape[:-1], rows.shape[-1]             # [..., K] runs as rows [M, K]
    k = width // 2 if swiglu else width
    x = _rows_f32(rows if rows.dim() == 2 else rows.reshape(-1, width))
    m = x.shape[0]
    b = None if bias is None else bias.float().contiguous()
    w = None if norm is None else norm[0].float().contiguous()
    r = None if residual is None else _rows_f32(residual.reshape(-1, n))
    cos, sin, heads = (None, None, 0) if rope is None else (rope[0].float().contiguous(), rope[1].float().contiguous(),
                                                              rope[2])
    out = torch.empty(m, n, dtype=torch.float32)
    if fn(x.data_ptr(), m, x.stride(0), blocked.data_ptr(), n, k, _ptr(b), _ptr(w), norm[1] if norm else 0.0,
          int(swiglu), _ptr(r), r.stride(0) if r is not None else 0, _ptr(cos), _ptr(sin), heads,
          cos.shape[-1] if cos is not None else 0, out.data_ptr(), n, min_rows, torch.get_num_threads()):
        raise MemoryError("linear_bf16: no memory for the rounded input rows")
    out = out if rows.dim() == 2 else out.view(*lead, n)
    return out if rows.dtype == torch.float32 else out.to(rows.dtype)


def _rows_f32(x: torch.Tensor) -> torch.Tensor:
    """[M, K] fp32 with contiguous rows (a row stride between them is kept)."""
    return x if x.dtype == torch.float32 and x.stride(-1) == 1 else x.float().contiguous()


def _ptr(t: torch.Tensor | None):
    return None if t is None else t.data_ptr()


def _probe(fn) -> bool:
    """The product, and each fusion on inputs whose fused values every exact implementation
    computes to the same bits (so their bf16 rounding cannot differ from the reference's by a
    step on another CPU's libm): rows of +-2 with eps 0 normalise by exactly 1/2; a gate of +-30
    gives silu exactly 30 or about -3e-12."""
    gen = torch.Generator().manual_seed(0)
    for n, k in ((70, 33), (128, 64)):          # a partial group and an odd K; whole groups
        w, x = torch.randn(n, k, generator=gen).bfloat16(), torch.randn(3, k, generator=gen)
        bias, weight = torch.randn(n, generator=gen), torch.randn(k, generator=gen).bfloat16().float()
        signs = torch.randn(3, k, generator=gen).sign()
        gate_up = torch.cat([30 * signs, torch.randn(3, k, generator=gen)], dim=-1)
        residual = torch.randn(3, n, generator=gen)
        cases = [(product(x, pack(w), n, bias, 4, fn), x),
                 (product(2 * signs, pack(w), n, bias, 4, fn, norm=(weight, 0.0)), signs * weight),
                 (product(gate_up, pack(w), n, bias, 1, fn, swiglu=True, residual=residual) - residual,
                  F.silu(gate_up[:, :k]) * gate_up[:, k:])]
        for got, rows in cases:
            want = F.linear(rows.bfloat16().float(), w.float(), bias)
            if not (got - want).abs().max() <= PROBE_TOLERANCE * want.abs().max():
                return False
    return True
