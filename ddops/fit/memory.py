"""Per-GPU memory arithmetic of an SGLang launch, as SGLang sizes its pools. Pure.

SGLang (docs/references.md, section "SGLang memory") measures `pre` = free memory before the
weights load, loads target + draft weights, then keeps `pre * (1 - fraction)` back as headroom
for activations and CUDA graphs. What is left (`rest = pre * fraction - weights`) holds the
per-request token table, the linear-attention (mamba) state slots and the KV pool:

    kv_tokens = floor(kv_budget / cell)    cell = bytes per token over all KV layers, one GPU

then capped by --max-total-tokens when that is lower (a higher cap is
ignored with a warning); a cap below the context length leaves no fraction that works.

The headroom must also cover SGLang's own reserve heuristic, which gives the highest fraction
that survives graph capture and load; the lowest one leaves room for one context-length
request. Between them lies the window of fractions that work.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ddops.fit.gpus import MIB, GpuKind
from ddops.fit.model import ModelFacts, dtype_bytes
from ddops.profile.sglang_versions import at_least

CUDA_CONTEXT = 512 * MIB  # CUDA context + NCCL before the first allocation (0.3-0.6 GB measured)
MAMBA_FULL_MEMORY_RATIO = 0.9  # SGLang's --mamba-full-memory-ratio default
SPEC_MAX_RUNNING = 48  # SGLang's --max-running-requests when a speculative method leaves it unset
PLAIN_MAX_RUNNING = 2048  # the lower clamp of SGLang's plain default, used to size the token table
GRAPH_MAX_BS = 32  # decode CUDA-graph batch size SGLang picks for a <60 GB card at tp < 4
PREFILL_GRAPH_BUCKETS = 50
NO_FRACTION = 2.0  # a window's lower end above any fraction: none works
# request slots one running request holds in the mamba pool, per radix-cache strategy
SLOTS_PER_REQUEST = {None: 3, "auto": 3, "no_buffer": 3, "extra_buffer_lazy": 4, "extra_buffer": 5}


@dataclass(frozen=True)
class Setup:
    """One launch on one kind of GPU: what the profile (or the command line) says."""

    gpu: GpuKind
    tp: int
    fraction: float | None  # None: SGLang's default from its reserve heuristic
    context_length: int
    weights_dtype: str  # dtype the weights load in
    kv_dtype: str  # resolved: "auto" already replaced by the weights' dtype
    max_running_requests: int | None = None
    chunked_prefill_size: int | None = None
    cuda_graphs: bool = True
    graph_max_bs: int | None = None
    verify_tokens: int = 0  # tokens the target verifies per round (0: plain decoding)
    mamba_slots: int | None = None  # --max-mamba-cache-size
    ssm_dtype: str | None = None  # --mamba-ssm-dtype (None: the model's)
    mamba_ratio: float | None = None  # --mamba-full-memory-ratio
    mamba_strategy: str | None = None
    max_total_tokens: int | None = None  # --max-total-tokens: a cap on the KV pool's tokens
    # Free before the weights load, when the device says it (a CPU host's MemAvailable per NUMA
    # node, host_memory.NodeMemory); None: the card's memory less its CUDA context.
    available: int | None = None
    sglang_version: str | None = None   # the profile's sglang_version: some defaults moved between releases


@dataclass(frozen=True)
class Pools:
    """Sizes per GPU, in bytes unless named otherwise."""

    capacity: int
    pre: int
    weights: int
    target_weights: int
    draft_weights: int
    reserve: int  # SGLang's headroom heuristic
    fraction: float
    fraction_is_default: bool
    headroom: int
    rest: int  # pre * fraction - weights
    token_table: int
    cell: int  # KV bytes per token, target + draft
    draft_cell: int
    mamba_slot: int  # recurrent state of one request slot
    mamba_spec: int  # per-draft-token intermediate states (speculative verify on hybrids)
    mamba_slots: int
    mamba_bytes: int
    kv_budget: int
    kv_tokens: int
    max_running_requests: int
    slots_per_request: int
    window: tuple[float, float]  # fractions that work: (lowest, highest); lowest > highest = none
    min_viable: float  # SGLang's "minimum viable" fraction: weights alone
    context_length: int

    @property
    def one_request_fits(self) -> bool:
        return self.kv_tokens >= self.context_length

    @property
    def full_length_requests(self) -> int:
        by_kv = self.kv_tokens // self.context_length if self.context_length else 0
        by_mamba = self.mamba_slots // self.slots_per_request if self.mamba_slot else by_kv
        return max(0, min(by_kv, by_mamba, self.max_running_requests))


def plan(setup: Setup, target: ModelFacts, draft: ModelFacts | None = None) -> Pools:
    """The pools SGLang would size for `setup`, per GPU."""
    tp = setup.tp
    capacity = setup.gpu.memory_bytes
    pre = setup.available if setup.available is not None else capacity - CUDA_CONTEXT
    target_w = math.ceil(target.weight_bytes(setup.weights_dtype) / tp)
    draft_w = math.ceil(draft.weight_bytes(setup.weights_dtype) / tp) if draft else 0
    weights = target_w + draft_w
    reserve = reserve_bytes(setup)
    default = round((capacity - reserve) / capacity, 3)
    fraction = setup.fraction if setup.fraction is not None else default
    draft_cell = kv_cell(draft, setup) if draft else 0
    cell = kv_cell(target, setup) + draft_cell
    running = setup.max_running_requests or (SPEC_MAX_RUNNING if setup.verify_tokens else PLAIN_MAX_RUNNING)
    table = (running + 1) * (setup.context_length + 8) * 4  # req_to_token: int32 per slot
    slot, spec = mamba_bytes(target, setup, running)
    ratio = setup.mamba_ratio or MAMBA_FULL_MEMORY_RATIO
    per_request = SLOTS_PER_REQUEST.get(setup.mamba_strategy, 3)
    rest = int(pre * fraction) - weights
    slots, mamba, kv_budget = _split(rest - table, slot, spec, setup.mamba_slots, ratio)
    kv_tokens = max(0, kv_budget // cell) if cell else 0
    if setup.max_total_tokens:
        kv_tokens = min(kv_tokens, setup.max_total_tokens)
    if not setup.max_running_requests and not setup.verify_tokens:
        running = min(max(2048, min(4096, kv_tokens * 512 // max(setup.context_length, 1))), kv_tokens // 2)
    low = _lowest(pre, weights, table, setup.context_length * cell, slot, spec, per_request,
                  setup.mamba_slots, ratio)
    if setup.max_total_tokens and setup.max_total_tokens < setup.context_length:
        low = NO_FRACTION       # the cap, not the fraction, keeps one request out
    high = 1 - reserve / pre
    return Pools(capacity, pre, weights, target_w, draft_w, reserve, fraction, setup.fraction is None,
                 int(pre * (1 - fraction)), rest, table, cell, draft_cell, slot, spec, slots, mamba,
                 kv_budget, kv_tokens, running, per_request, (math.ceil(low * 1000) / 1000,
                                                              math.floor(high * 1000) / 1000),
                 weights / pre, setup.context_length)


def reserve_bytes(s: Setup) -> int:
    """SGLang's default headroom (MB arithmetic of its memory hook), on this GPU."""
    gib = s.gpu.memory_bytes / (1 << 30)
    chunk = s.chunked_prefill_size if s.chunked_prefill_size else auto_chunked_prefill(gib, s.sglang_version)
    mib = 512 + 1.5 * max(chunk, 2048) + s.tp / 8 * 1024
    if s.cuda_graphs:
        mib += 2 * min(s.graph_max_bs or GRAPH_MAX_BS, s.max_running_requests or GRAPH_MAX_BS)
        mib += 8 * PREFILL_GRAPH_BUCKETS
    if gib > 60:
        mib = max(mib, 10 * 1024)
    return int(mib * MIB)


def auto_chunked_prefill(gib: float, version: str | None = None) -> int:
    """SGLang's --chunked-prefill-size default by device memory. 0.5.23 (arg_groups/memory_hook.py)
    takes 4096 from 20 to 35 GiB; 0.5.15 (server_args.py) took 2048 there, and the CPU engine is
    0.5.15 (measured: chunked_prefill_size=2048 and mem_fraction_static 0.846 on a 23.5 GiB node)."""
    if version is not None and not at_least(version, "0.5.16") and 20 <= gib < 35:
        return 2048
    for limit, chunk in ((20, 2048), (35, 4096), (60, 4096), (90, 8192), (160, 8192)):
        if gib < limit:
            return chunk
    return 16384


def kv_cell(model: ModelFacts, s: Setup) -> int:
    """KV bytes per token on one GPU: full-attention layers only; KV heads split by TP (>= 1)."""
    a = model.attention
    heads = max(1, a.kv_heads // s.tp)
    return int(a.layers * heads * (a.head_dim + a.v_head_dim) * dtype_bytes(s.kv_dtype))


def mamba_bytes(model: ModelFacts, s: Setup, running: int) -> tuple[int, int]:
    """(one request slot, speculative intermediate buffer) of linear-attention state, one GPU."""
    lin = model.linear
    if lin is None:
        return 0, 0
    ssm = lin.layers * max(1, lin.v_heads // s.tp) * lin.k_head_dim * lin.v_head_dim \
        * dtype_bytes(s.ssm_dtype or lin.ssm_dtype)
    conv = lin.layers * (lin.conv_dim // s.tp) * (lin.conv_kernel - 1) * dtype_bytes(s.weights_dtype)
    # verify keeps the state after every draft token: [layers, running + 1, tokens, ...]
    spec = (ssm + conv) * (running + 1) * s.verify_tokens
    return int(ssm + conv), int(spec)


def _split(rest: int, slot: int, spec: int, slots: int | None, ratio: float) -> tuple[int, int, int]:
    """(mamba slots, mamba bytes, KV budget) from what is left after weights and the token table."""
    if not slot:
        return 0, 0, rest
    if slots is not None:
        mamba = (slots + 1) * slot + spec
        return slots, mamba, rest - mamba
    mamba = int(rest * ratio / (1 + ratio))
    return max(0, (mamba - spec) // slot - 1), mamba, rest - mamba


def _lowest(pre: int, weights: int, table: int, one_request: int, slot: int, spec: int,
            per_request: int, slots: int | None, ratio: float) -> float:
    """Smallest fraction that leaves KV room for one context-length request (and its state)."""
    need = one_request
    if slot and slots is not None:
        need += (slots + 1) * slot + spec
    elif slot:  # auto split: KV gets 1/(1+r) of the rest, the state r/(1+r)
        need = max(one_request * (1 + ratio), (spec + (per_request + 1) * slot) * (1 + ratio) / ratio)
    return (weights + table + need) / pre
