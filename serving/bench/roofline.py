"""The weight-streaming limit of decoding on one core: the bandwidth that core reads memory at,
over the bytes one decode step reads.

One decode step reads every weight once (a tied embedding once, as the LM head) whatever the
number of sequences in the batch, so with C clients the limit is C x bandwidth / weight bytes
tokens a second, before compute, K/V reads and everything else a step does. The bandwidth is a
one-thread torch sum over 512 MiB on the core the server runs on, measured in the same run as
the figures set against it.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import torch

from serving.memory import DTYPE_BYTES, target_params
from serving.models.config import read_model_config

STREAM_BYTES = 512 << 20


def stream_gb_s(core: int, repeats: int = 5) -> float:
    """GB/s one thread on `core` reads memory at (the best of `repeats` sums over 512 MiB)."""
    affinity, threads = os.sched_getaffinity(0), torch.get_num_threads()
    os.sched_setaffinity(0, {core})
    torch.set_num_threads(1)
    try:
        data = torch.ones(STREAM_BYTES // 4)
        best = float("inf")
        for _ in range(repeats):
            began = time.perf_counter()
            data.sum()
            best = min(best, time.perf_counter() - began)
        return STREAM_BYTES / best / 1e9
    finally:
        os.sched_setaffinity(0, affinity)
        torch.set_num_threads(threads)


def step_bytes(model: Path, dtype: str) -> int:
    """Bytes of weights one decode step reads: every parameter of the target once, in `dtype`."""
    return target_params(read_model_config(model)) * DTYPE_BYTES[dtype]


def limit_tok_s(gb_s: float, weight_bytes: int, clients: int) -> float:
    """Tokens a second `clients` streams could decode if a step cost only its weight reads."""
    return clients * gb_s * 1e9 / weight_bytes
