"""Plain-decode attention for a batch, reading each sequence's K/V in place in the pool.

The PyTorch form (serving.models.decode_attention) gathers every sequence's keys and values into
one padded [B, KV, L, D] block per layer so one SDPA call serves the batch: it reads each cache
once, writes the block, and SDPA reads the block again, three times the K/V traffic, about a
fifth of a SmolLM2 decode step at batch 8 on one core. This kernel reads the rows where they are
(as vLLM's CPU backend does with its paged cache, `cpu_attention_with_kv_cache`), writes the new
rows itself, and takes q, k, v straight from the projection's output (row strides, no copies).

It runs only where it can: fp32 rows over an fp32 or bf16 pool on CPU, the library built
(serving.kernels.build), and a probe at first use that agrees with SDPA over each pool dtype.
`available()` says which and why. A bf16 pool's rows widen to fp32 as they are read; new rows
are rounded as torch rounds them (`Tensor.to(torch.bfloat16)`), so either writer leaves the same
bits.
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
    return build.function("decode_attention", "ddops_rows_attention", ctypes.c_int,
                          [_PTR, _I64, _PTR, _I64, _PTR, _I64, _PTR, _PTR, _I64, _PTR, _PTR, _PTR, _PTR, _PTR,
                           _PTR, _I64, _I64, _I64, _I64, ctypes.c_float, ctypes.c_int, ctypes.c_int], _probe, "SDPA")


POOL_DTYPES = (torch.float32, torch.bfloat16)


def available(dtype: torch.dtype, device: torch.device, rows: torch.dtype = torch.float32) -> tuple[bool, str]:
    """(True, "") when the kernel serves a pool of this dtype on this device, attending rows
    (queries, new K/V) of dtype `rows`, else (False, why)."""
    if rows != torch.float32:
        return False, f"the kernel attends fp32 rows, not {rows}"
    return build.serves(_library(), dtype, device, POOL_DTYPES)


def _rows(t: torch.Tensor) -> tuple[torch.Tensor, int]:
    """t [B, heads, D] with heads of D contiguous elements (a row stride between sequences)."""
    if t.stride(2) != 1 or t.stride(1) != t.shape[2]:
        t = t.contiguous()
    return t, t.stride(0)


def attend(q, k, v, pool_k, pool_v, starts, lengths, fn=None) -> torch.Tensor:
    """A plain decode step: q [B, H, D], k, v [B, KV, D] (the new rows); pool_k, pool_v [KV, R, D]
    one layer's pool; starts, lengths int64 [B] (lengths count the new row). Writes k, v at row
    starts + lengths - 1 and returns out [B, H * D]."""
    return attend_rows(q, k, v, pool_k, pool_v, starts + lengths - 1, starts, lengths,
                       torch.zeros(len(starts) + 1, dtype=torch.int64), _NO_ROWS, fn)


_NO_ROWS = torch.zeros(1, dtype=torch.int64)       # a valid pointer where no row lists a key


def attend_rows(q, k, v, pool_k, pool_v, writes, starts, prefix, extra_offsets, extra_rows, fn=None) -> torch.Tensor:
    """B new rows, each over its own keys: q [B, H, D], k, v [B, KV, D]; writes int64 [B] the pool
    row each new k, v goes to (all written before any is read); row b's keys are pool rows
    [starts[b], starts[b] + prefix[b]) then extra_rows[extra_offsets[b]:extra_offsets[b + 1]].
    Returns out [B, H * D]."""
    fn = fn or _library()[0]
    B, H, D = q.shape
    KV = k.shape[1]
    if not (pool_k.is_contiguous() and pool_v.is_contiguous()):
        raise ValueError("the pool's layer tensors must be contiguous")
    if pool_k.dtype not in POOL_DTYPES or pool_v.dtype != pool_k.dtype or q.dtype != torch.float32:
        raise ValueError(f"fp32 rows over an fp32 or bf16 pool, not {q.dtype} over {pool_k.dtype}")
    (q, qs), (k, ks), (v, vs) = _rows(q), _rows(k), _rows(v)
    out = torch.empty(B, H * D, dtype=q.dtype)
    failed = fn(q.data_ptr(), qs, k.data_ptr(), ks, v.data_ptr(), vs, pool_k.data_ptr(), pool_v.data_ptr(),
                pool_k.shape[1], writes.data_ptr(), starts.data_ptr(), prefix.data_ptr(), extra_offsets.data_ptr(),
                (extra_rows if len(extra_rows) else _NO_ROWS).data_ptr(), out.data_ptr(),
                B, H, KV, D, D ** -0.5, pool_k.dtype == torch.bfloat16, torch.get_num_threads())
    if failed:
        raise MemoryError("decode attention: no memory for the scores buffer")
    return out


def _probe(fn) -> bool:
    """Two sequences of unequal length over one pool of each dtype, against SDPA on the same
    rows in fp32; a bf16 pool's new rows written as torch rounds them."""
    return all(_agrees(fn, dtype) for dtype in POOL_DTYPES)


def _agrees(fn, dtype: torch.dtype) -> bool:
    gen = torch.Generator().manual_seed(0)
    KV, G, D, R = 2, 3, 16, 24
    pool_k, pool_v = (torch.randn(KV, R, D, generator=gen).to(dtype) for _ in range(2))
    q, k, v = torch.randn(2, KV * G, D, generator=gen), torch.randn(2, KV, D, generator=gen), torch.randn(2, KV, D, generator=gen)
    starts, lengths = torch.tensor([3, 12]), torch.tensor([5, 9])
    written_k, written_v = pool_k.clone(), pool_v.clone()
    got = attend(q, k, v, written_k, written_v, starts, lengths, fn)
    for b in range(2):
        s, n = int(starts[b]), int(lengths[b])
        keys, values = pool_k[:, s:s + n].clone(), pool_v[:, s:s + n].clone()
        keys[:, -1], values[:, -1] = k[b], v[b]          # rounded to the pool's dtype as stored
        if not (torch.equal(written_k[:, s:s + n], keys) and torch.equal(written_v[:, s:s + n], values)):
            return False
        want = F.scaled_dot_product_attention(q[b].view(KV, G, 1, D), keys[:, None].float(), values[:, None].float())
        if not torch.allclose(got[b], want.reshape(-1), atol=PROBE_TOLERANCE, rtol=0):
            return False
    return True
