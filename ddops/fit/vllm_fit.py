"""A vLLM profile on a kind of GPU (or on CPU) -> VllmSetup -> plan -> verdict. Pure.

Reasons follow the order vLLM fails in, each with the words vLLM stops with: the utilization
above the card's free memory at start (v1/worker/utils.py `request_memory`), then nothing left
for KV blocks after weights, profiling and graphs, then one max_model_len request larger than
the cache (v1/core/kv_cache_utils.py `_check_enough_kv_cache_memory`). Suggestions are
re-planned before they are offered.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from ddops.fit.gpus import GpuKind
from ddops.fit.model import ModelFacts
from ddops.fit.verdict import Verdict, gib
from ddops.fit.vllm_memory import (DEFAULT_UTILIZATION, VllmPlan, VllmSetup, plan)
from ddops.profile import RUNTIMES, Profile
from ddops.profile.extra_args import switch_on, values_of, args_of

GIB_BYTES = 1 << 30
CPU_KV_ENV = "VLLM_CPU_KVCACHE_SPACE"
ESTIMATED = ("activation peak", "non-torch memory", "CUDA graphs")
MAX_TP = 8


@dataclass(frozen=True)
class VllmAssessment:
    setup: VllmSetup
    plan: VllmPlan
    verdict: Verdict

    @property
    def one_request_fits(self) -> bool:
        return self.plan.one_request_fits

    @property
    def full_length_requests(self) -> int:
        return min(int(self.plan.concurrency), self.setup.max_num_seqs)


def setup_for(profile: Profile, gpu: GpuKind | None, target: ModelFacts, draft: ModelFacts | None,
              tp: int | None = None) -> VllmSetup:
    memory, device = profile.memory, profile.service.device or "cuda"
    tp = tp or profile.model.tp_size
    weights = profile.model.dtype if profile.model.dtype != "auto" else target.dtype
    batched, seqs = defaults(device, gpu, tp)
    return VllmSetup(
        device=device, gpu=gpu if device == "cuda" else None, tp=tp,
        utilization=memory.mem_fraction_static or DEFAULT_UTILIZATION,
        utilization_is_default=memory.mem_fraction_static is None,
        max_model_len=memory.context_length or target.max_position_embeddings,
        max_num_seqs=memory.max_running_requests or seqs,
        batched_tokens=memory.chunked_prefill_size or batched,
        weights_dtype=weights, kv_dtype=kv_dtype(memory.kv_cache_dtype, weights),
        block_size=_int_arg(profile, "--block-size"),
        speculative_tokens=speculative_tokens(profile, draft),
        cuda_graphs=profile.cuda_graph.enabled and device == "cuda", max_capture=profile.cuda_graph.max_bs,
        prefix_caching=not switch_on(profile, "--no-enable-prefix-caching"),
        cpu_kv_bytes=cpu_kv_bytes(profile),
    )


def defaults(device: str, gpu: GpuKind | None, tp: int) -> tuple[int, int]:
    """vllm serve's max_num_batched_tokens and max_num_seqs (engine/arg_utils.py)."""
    if device == "cpu":
        return 2048 * tp, 128 * tp
    memory = gpu.memory_bytes if gpu else 0
    if memory >= 160 * GIB_BYTES:
        return 16384, 1024
    if memory >= 70 * GIB_BYTES and "a100" not in gpu.name.lower():
        return 8192, 1024
    return 2048, 256


def kv_dtype(value: str | None, weights: str) -> str:
    """--kv-cache-dtype: auto is the model's dtype; every fp8 spelling is one byte."""
    if not value or value == "auto":
        return weights
    return "fp8_e4m3" if value.startswith("fp8") else value


def speculative_tokens(profile: Profile, draft: ModelFacts | None) -> int:
    """num_speculative_tokens, as the flag table writes it (DFlash: block - 1)."""
    if not profile.method.is_speculative:
        return 0
    row = next(f for f in RUNTIMES[profile.runtime].flags if f.field == "num_speculative_tokens")
    block = profile.speculative.block_size or (draft.block_size if draft else None) or 0
    return max(0, block + row.offset)


def cpu_kv_bytes(profile: Profile) -> int | None:
    """VLLM_CPU_KVCACHE_SPACE GiB becomes kv_cache_memory_bytes (platforms/cpu.py)."""
    value = profile.service.environment.get(CPU_KV_ENV)
    return int(value) * GIB_BYTES if value not in (None, "") else None


def _int_arg(profile: Profile, flag: str) -> int | None:
    values = values_of(args_of(profile), flag)
    return int(values[-1]) if values and values[-1] and values[-1].isdigit() else None


def assess(s: VllmSetup, target: ModelFacts, draft: ModelFacts | None = None) -> VllmAssessment:
    p = plan(s, target, draft)
    reasons = problems(s, p)
    where = _where(s)
    if reasons:
        headline = f"does not fit {where}"
    elif s.device == "cpu" and s.cpu_kv_bytes is None:
        headline = f"KV cache not checked on {where}: {CPU_KV_ENV} not set"
    else:
        headline = (f"fits {where}: KV cache {gib(p.available)} = {p.num_blocks:,} blocks of "
                    f"{p.block_size} tokens, {p.kv_tokens:,} tokens, {p.concurrency:.2f}x "
                    f"max_model_len {s.max_model_len:,}")
    warnings = () if reasons else tuple(_warnings(s, p))
    ideas = tuple(_suggest(s, p, target, draft)) if reasons else ()
    return VllmAssessment(s, p, Verdict(not reasons, headline, tuple(reasons), warnings, ideas))


def problems(s: VllmSetup, p: VllmPlan) -> list[str]:
    if s.device == "cpu":
        return _cpu_problems(s, p)
    if p.requested > p.free_at_start:
        return [f"gpu-memory-utilization {s.utilization} asks for {gib(p.requested)} of a {s.gpu.name} "
                f"with about {gib(p.free_at_start)} free at start: vLLM stops with \"Free memory on device "
                f"... is less than desired GPU memory utilization\""]
    if p.weights >= p.requested:
        split = f" split over {s.tp} GPUs" if s.tp > 1 else ""
        draft = f" + draft {gib(p.draft_weights)}" if p.draft_weights else ""
        return [f"weights alone need {gib(p.weights)} per GPU (target {gib(p.target_weights)}{draft}{split}) "
                f"and gpu-memory-utilization {s.utilization} of a {s.gpu.name} is {gib(p.requested)}"]
    return _kv_problems(s, p)


def _cpu_problems(s: VllmSetup, p: VllmPlan) -> list[str]:
    if s.cpu_kv_bytes is None:
        return []
    return _kv_problems(s, p)


def _kv_problems(s: VllmSetup, p: VllmPlan) -> list[str]:
    if p.available <= 0 and s.device == "cpu":
        return [f"{CPU_KV_ENV}=0 leaves no KV cache: vLLM stops with \"No available memory for the cache blocks\""]
    if p.available <= 0:
        return [f"after weights {gib(p.weights)} and the estimated {_estimates(p)} nothing is left of "
                f"{gib(p.requested)}: vLLM stops with \"No available memory for the cache blocks\""]
    if not p.one_request_fits:
        longest = f" the estimated maximum model length is {p.longest_len:,}" if p.longest_len else ""
        return [f"one request of max_model_len {s.max_model_len:,} needs {gib(p.needed)} of KV cache, more "
                f"than the {gib(p.available - p.bytes_per_block)} available ({_source(s)}): vLLM stops with "
                f"\"To serve at least one request with the model's max seq len ({s.max_model_len}), "
                f"... KV cache is needed, which is larger than the available KV cache memory\";{longest}"]
    return []


def _source(s: VllmSetup) -> str:
    return f"{CPU_KV_ENV}={s.cpu_kv_bytes // GIB_BYTES}" if s.device == "cpu" else \
        f"gpu-memory-utilization {s.utilization}, less weights and estimates"


def _estimates(p: VllmPlan) -> str:
    return (f"activation peak {gib(p.activation)}, non-torch {gib(p.non_torch)}, "
            f"CUDA graphs {gib(p.cuda_graphs)}")


def _warnings(s: VllmSetup, p: VllmPlan) -> list[str]:
    found = []
    if s.device == "cpu" and s.cpu_kv_bytes is None:
        found.append(f"{CPU_KV_ENV} not set in service.environment: vLLM takes host memory x "
                     f"gpu-memory-utilization less its own resident memory, which fit cannot know")
        return found
    full = int(p.concurrency)
    if full < s.max_num_seqs:
        found.append(f"only {full} request(s) of max_model_len {s.max_model_len:,} fit at once "
                     f"(max-num-seqs {s.max_num_seqs}); shorter ones share the blocks")
    if s.device == "cuda":
        found.append(f"estimated, measured by vLLM at start: {_estimates(p)}")
    if s.utilization_is_default and s.device == "cuda":
        found.append(f"gpu-memory-utilization not set: vLLM's default {DEFAULT_UTILIZATION}")
    return found


def _where(s: VllmSetup) -> str:
    if s.device == "cpu":
        return "CPU"
    return f"{s.tp} x {s.gpu.name} at gpu-memory-utilization {s.utilization}"


def _suggest(s: VllmSetup, p: VllmPlan, target: ModelFacts, draft: ModelFacts | None) -> list[str]:
    ideas = []
    if s.device == "cuda" and p.weights < p.requested:
        used = p.weights + p.non_torch + p.activation + p.cuda_graphs + p.needed + p.bytes_per_block
        wanted = math.ceil(used / p.capacity * 100) / 100
        if s.utilization < wanted <= p.free_at_start / p.capacity and fits(replace(s, utilization=wanted), target, draft):
            ideas.append(f"raise memory.mem_fraction_static (--gpu-memory-utilization) to {wanted}")
    longest = (p.longest_len // 1024) * 1024
    if 0 < longest < s.max_model_len and fits(replace(s, max_model_len=longest), target, draft):
        ideas.append(f"lower memory.context_length (--max-model-len) to {longest:,} or less")
    if s.device == "cuda":
        more = next((tp for tp in (2, 4, MAX_TP) if tp > s.tp and fits(replace(s, tp=tp), target, draft)), None)
        if more:
            ideas.append(f"use more GPUs: model.tp_size {more} fits")
    return ideas or ["no single change fits: a larger GPU, a smaller model or quantized weights"]


def fits(s: VllmSetup, target: ModelFacts, draft: ModelFacts | None) -> bool:
    return not problems(s, plan(s, target, draft))
