"""The weight-streaming limit of decoding on one core: the bandwidth that core reads memory at,
over the bytes one decode step reads.

One decode step reads every weight once (a tied embedding once, as the LM head) whatever the
number of sequences in the batch, so with C clients the limit is C x bandwidth / weight bytes
tokens a second, before compute, K/V reads and everything else a step does. The bandwidth is a
one-thread torch sum over 512 MiB on the core the server runs on, measured in the same run as
the figures set against it, the best over ordinary memory and over memory on transparent huge
pages (where the bundled runtime keeps its bf16 weights: serving.kernels.linear_bf16.arena), so
the limit is what the core can read, not what one kind of page lets it.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import torch

from serving.kernels import linear_bf16
from serving.memory import DTYPE_BYTES, target_params
from serving.models.config import read_model_config

STREAM_BYTES = 512 << 20


def stream_gb_s(core: int, repeats: int = 5) -> dict[str, float]:
    """GB/s one thread on `core` reads memory at, by kind of page: the best of `repeats` sums over
    512 MiB of ordinary memory ("ordinary") and as many over 512 MiB on huge pages ("huge_pages"),
    interleaved. The limit is the larger (this project's EPYC: 18-21 against 28-31 GB/s)."""
    affinity, threads = os.sched_getaffinity(0), torch.get_num_threads()
    os.sched_setaffinity(0, {core})
    torch.set_num_threads(1)
    try:
        buffers = {"ordinary": torch.ones(STREAM_BYTES // 4),
                   "huge_pages": linear_bf16.arena(STREAM_BYTES // 2).view(torch.float32).fill_(1)}  # touched
        best = dict.fromkeys(buffers, float("inf"))
        for _ in range(repeats):
            for kind, data in buffers.items():
                began = time.perf_counter()
                data.sum()
                best[kind] = min(best[kind], time.perf_counter() - began)
        return {kind: STREAM_BYTES / seconds / 1e9 for kind, seconds in best.items()}
    finally:
        os.sched_setaffinity(0, affinity)
        torch.set_num_threads(threads)


def step_bytes(model: Path, dtype: str) -> int:
    """Bytes of weights one decode step reads: every parameter of the target once, in `dtype`."""
    return target_params(read_model_config(model)) * DTYPE_BYTES[dtype]


def limit_tok_s(gb_s: float, weight_bytes: int, clients: int) -> float:
    """Tokens a second `clients` streams could decode if a step cost only its weight reads."""
    return clients * gb_s * 1e9 / weight_bytes
