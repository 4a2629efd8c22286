"""What the bundled runtime (`python -m serving`) allocates for a profile. Pure.

Its allocation model is simple and exact, and its rules are the runtime's own
(serving.contract.runtime; the bytes, serving.contract.sizes): every target parameter, and a
drafter's projection matrices, in the runtime's dtype (its other parameters in the dtype the
target computes in: compute_dtype); the target's K/V over its full-attention layers (in the
runtime's dtype: kv_dtype), one pool sized at start by the runtime's rule (`pool_rows`: max running
x (context_length + verify_tokens), within --mem-fraction-static of the device's memory less the
rest, never below one sequence, capped by `--max-total-tokens` when a profile passes it in
`sglang.extra_args`; the verify rows hold one verify pass past the context); for a target
served one sequence at a time (a speculative
hybrid) one cache of context + verify rows instead; with a drafter, the draft's context K/V
for the target's rows over the draft's layers (a draft pool beside the batch runner's pool,
each sequence's draft context the same rows as its target reservation, or the one-sequence
decoder's cache), for the server's life; and for hybrid targets linear-attention state slots
(conv state in the runtime dtype, recurrent state in fp32 whatever the config's
mamba_ssm_dtype): one per running sequence when decoding plainly, one with a speculative
method; and a dense target's prefix store, preallocated beside the pool (`prefix_rows`: 128
blocks x 8 rows, each the target's K/V of a position plus, with a drafter, its target features
of the draft's feature width, in the runtime dtype; none when `sglang.extra_args` passes
--disable-radix-cache). The runtime reports the same numbers,
measured from its tensors, under `/server_info` `memory` (`kv_cache_bytes`: target and draft
together; `prefix_cache_bytes`: the prefix store).
"""

from __future__ import annotations

from dataclasses import dataclass

from ddops.fit.gpus import GpuKind
from ddops.fit.memory import CUDA_CONTEXT
from ddops.fit.model import Attention, LinearState, ModelFacts, dtype_bytes
from ddops.fit.profile_fit import Models, needs_gpu, verify_tokens
from ddops.profile import Profile
from ddops.profile.extra_args import int_value, switch_on
from ddops.profile.runtimes import POOL_CAP_FLAG
from serving.contract.runtime import (DEFAULT_MAX_RUNNING, DEFAULT_MEM_FRACTION, auto_dtype, compute_dtype,
                                      draft_kv_rows, draft_projection_dtype, head_copies, kv_dtype, kv_rows,
                                      one_at_a_time, pool_rows, prefix_rows, state_slots)
from serving.contract.sizes import kv_bytes, linear_state_bytes


@dataclass(frozen=True)
class BundledMemory:
    dtype: str
    kv_slots: int  # target K/V rows
    weights_bytes: int
    kv_cache_bytes: int  # target and draft K/V
    state_cache_bytes: int = 0
    draft_kv_slots: int = 0  # draft context K/V rows preallocated (with a drafter)
    prefix_cache_bytes: int = 0  # the prefix store (dense targets)
    pool: PoolRule | None = None  # how the start-up rule sized the pool (None: one sequence at a time)

    @property
    def predicted_bytes(self) -> int:
        return self.weights_bytes + self.kv_cache_bytes + self.state_cache_bytes + self.prefix_cache_bytes

    def as_dict(self) -> dict:
        return {"dtype": self.dtype, "kv_slots": self.kv_slots, "draft_kv_slots": self.draft_kv_slots,
                "weights_bytes": self.weights_bytes, "kv_cache_bytes": self.kv_cache_bytes,
                "state_cache_bytes": self.state_cache_bytes, "prefix_cache_bytes": self.prefix_cache_bytes,
                "predicted_bytes": self.predicted_bytes, "pool": self.pool.as_dict() if self.pool else None}


@dataclass(frozen=True)
class PoolRule:
    """The runtime's start-up rule for its pool (serving.contract.runtime.pool_rows), as fit applied it."""

    max_running: int
    sequence_rows: int  # context + verify: one sequence at full context
    fraction: float  # --mem-fraction-static, or the runtime's default for the device
    memory_bytes: int | None  # what the cap is a share of; None: not known to fit (no cap applied)
    memory_source: str  # where that figure comes from, in words
    cap: int | None  # --max-total-tokens

    @property
    def exact(self) -> bool:
        """The figure is the runtime's, not an estimate: no memory cap can apply, or its memory is known."""
        return self.memory_bytes is not None or bool(self.cap and self.cap <= self.sequence_rows)

    def as_dict(self) -> dict:
        return {"max_running": self.max_running, "sequence_rows": self.sequence_rows, "fraction": self.fraction,
                "memory_bytes": self.memory_bytes, "memory_source": self.memory_source, "cap": self.cap,
                "exact": self.exact}


def runtime_dtype(profile: Profile, target: ModelFacts, device: str, cpu_flags: frozenset[str] | None = None) -> str:
    """The dtype the runtime loads the target in: the profile's, or its --dtype auto
    (serving.contract.runtime.auto_dtype). On CPU auto follows the host's flags; without them
    (no host read) the figure is float32's, the larger a CPU host can get."""
    if profile.model.dtype != "auto":
        return profile.model.dtype
    return auto_dtype(device, target.dtype, cpu_flags or frozenset())


def device_of(profile: Profile) -> str:
    return "cuda" if needs_gpu(profile) else "cpu"


def bundled_memory(profile: Profile, models: Models, memory_bytes: int | None = None,
                   memory_source: str = "not known", device: str | None = None,
                   cpu_flags: frozenset[str] | None = None) -> BundledMemory:
    """What the runtime allocates; `memory_bytes` is what its pool rule caps from on the device
    (CPU: the host's memory or the unit's limit, CUDA: the card's free memory before load);
    `cpu_flags` the CPU host's, which its dtype may follow."""
    target, draft = models.target, models.draft
    on = device or device_of(profile)
    dtype = runtime_dtype(profile, target, on, cpu_flags)
    hybrid, speculative = target.linear is not None, profile.method.is_speculative
    compute = compute_dtype(on, dtype, hybrid)     # the drafter, its K/V, state and prefix features' dtype
    rows_dtype = kv_dtype(on, dtype, hybrid)       # the target's K/V rows'
    context = profile.memory.context_length or target.max_position_embeddings
    verify = verify_tokens(profile, draft)
    head = head_copies(on, dtype) * target.vocab_size * target.hidden_size
    weights = (target.weight_bytes(dtype) + int(head * dtype_bytes(dtype))
               + (draft_weight_bytes(draft, draft_projection_dtype(on, dtype, hybrid), compute) if draft else 0))
    sequences = state_slots(hybrid, speculative, profile.memory.max_running_requests)
    state = sequences * _state(target.linear, compute)
    features = draft.feature_width * dtype_bytes(compute) if draft else 0
    store_rows = prefix_rows(hybrid, switch_on(profile, "--disable-radix-cache"))
    prefix = store_rows * (_kv(target.attention, 1, rows_dtype) + int(features))
    row = _kv(target.attention, 1, rows_dtype) + (_kv(draft.attention, 1, compute) if draft else 0)
    rule, max_total = None, int_value(profile, POOL_CAP_FLAG)
    if not one_at_a_time(hybrid, speculative):
        fraction = profile.memory.mem_fraction_static or DEFAULT_MEM_FRACTION[on]
        running = profile.memory.max_running_requests or DEFAULT_MAX_RUNNING
        rule = PoolRule(running, context + verify, fraction, memory_bytes, memory_source, max_total)
        max_total = pool_rows(context + verify, running, row, weights + state + prefix, memory_bytes, fraction,
                              max_total)
    rows = kv_rows(hybrid, speculative, context, verify, max_total)
    draft_rows = draft_kv_rows(hybrid, speculative, context, verify, max_total) if draft else 0
    kv = _kv(target.attention, rows, rows_dtype) + (_kv(draft.attention, draft_rows, compute) if draft else 0)
    return BundledMemory(dtype, rows, weights, kv, state, draft_rows, prefix, rule)


@dataclass(frozen=True)
class BundledFit:
    """The bundled runtime's allocation against one card: it fits when the total is within what
    the card leaves after the CUDA context; without a card (CPU) host memory is not checked."""

    memory: BundledMemory
    card: GpuKind | None
    usable_bytes: int | None  # the card's memory less the CUDA context; None on CPU

    @property
    def fits(self) -> bool:
        return self.usable_bytes is None or self.memory.predicted_bytes <= self.usable_bytes


def bundled_fit(profile: Profile, models: Models, card: GpuKind | None, host_bytes: int | None = None,
                cpu_flags: frozenset[str] | None = None) -> BundledFit:
    """On a card the pool rule's memory is the card's less the CUDA context (assuming nothing
    else holds memory there; the runtime measures the free memory at start); on CPU the host's
    memory as read from it (`host_bytes`), else not known, and its flags (`cpu_flags`)."""
    usable = card.memory_bytes - CUDA_CONTEXT if card else None
    if card:
        source = (f"{card.name}'s memory less the CUDA context, the card otherwise free "
                  "(the runtime reads its free memory)")
        memory = bundled_memory(profile, models, usable, source, "cuda")
    elif host_bytes is not None:
        memory = bundled_memory(profile, models, host_bytes, "the host's memory (MemTotal, or the unit's MemoryMax)",
                                "cpu", cpu_flags)
    else:
        memory = bundled_memory(profile, models, cpu_flags=cpu_flags)
    return BundledFit(memory, card, usable)


def draft_weight_bytes(draft: ModelFacts, projections: str, rest: str) -> int:
    """A drafter's parameters: its projection matrices in `projections`, the rest in `rest`."""
    packed = min(draft.projection_params, draft.params)
    return int(packed * dtype_bytes(projections) + (draft.params - packed) * dtype_bytes(rest)) + draft.fixed_bytes


def _kv(a: Attention, rows: int, dtype: str) -> int:
    return kv_bytes(a.layers, a.kv_heads, a.head_dim, rows, dtype_bytes(dtype), a.v_head_dim)


def _state(s: LinearState | None, dtype: str) -> int:
    return linear_state_bytes(s.shape, s.layers, dtype_bytes(dtype)) if s else 0
