"""How fit predicts a profile, by its runtime's memory model (`Runtime.memory_model`): the one
place that choice is made. `ddops fit`, the checks validate and deploy run and the shadow's
check all call `predict`; what it returns says whether the profile fits, and `ddops fit` maps
that to its exit code once.

- "exact" (the bundled runtime): every allocation follows serving.contract, so the total is
  checked against the card (bundled.py); on CPU it sizes its pool from the host's memory
  (MemTotal, or the unit's MemoryMax) when fit can read it.
- "blocks" (vLLM): its KV budget in blocks (vllm_fit.py).
- "pools" (SGLang): its pools from the free memory at start (profile_fit.py, verdict.py); on CPU
  from the host's free RAM, which fit must read from the host.
SGLang's and vLLM's loaders split attention heads over the tensor-parallel ranks, so their
profiles meet the shape rules (shape.py) first.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ddops.fit import vllm_fit
from ddops.fit.bundled import BundledFit, bundled_fit
from ddops.fit.gpus import GpuKind
from ddops.fit.host_memory import read_host_memory, read_node_memory
from ddops.fit.profile_fit import Models, cpu_device, fit_profile, free_at_load, needs_gpu
from ddops.fit.shape import tp_problems
from ddops.fit.verdict import Assessment
from ddops.inventory import Host
from ddops.profile import RUNTIMES, Profile


@dataclass(frozen=True)
class Prediction:
    fits: bool
    reasons: tuple[str, ...]  # why it does not fit (empty when it fits)
    assessment: BundledFit | vllm_fit.VllmAssessment | Assessment | None  # None: the shape refused it
    shape_refused: bool = False  # `reasons` are tensor-parallel shape rules the runtime's loader asserts


@dataclass(frozen=True)
class MemoryModel:
    assess: Callable[[Profile, GpuKind | None, Models, int | None, object], Prediction]
    host_memory: Callable | None  # (remote, unit) -> what it sizes from on a CPU host; None: nothing
    needs_host_memory: bool  # on CPU fit cannot predict without it (not known from the profile)
    tp_rules: bool  # its loader splits heads over the tensor-parallel ranks
    checked: bool  # validate and deploy check it before a change
    cpu_from_profile: bool  # on CPU its memory is the profile's own setting (no host facts needed)
    contract_start_rules: bool = False  # refuses at start what serving.contract.runtime refuses (start_rules.py)


def _exact(profile: Profile, card: GpuKind | None, models: Models, tp: int | None, memory) -> Prediction:
    fit = bundled_fit(profile, models, card if needs_gpu(profile) else None, memory.memory if memory else None,
                      memory.flags if memory else None)
    return Prediction(fit.fits, (), fit)


def _blocks(profile: Profile, card: GpuKind | None, models: Models, tp: int | None, memory) -> Prediction:
    setup = vllm_fit.setup_for(profile, card, models.target, models.draft, tp)
    return _verdict(vllm_fit.assess(setup, models.target, models.draft))


def _pools(profile: Profile, card: GpuKind | None, models: Models, tp: int | None, memory) -> Prediction:
    if needs_gpu(profile):
        return _verdict(fit_profile(profile, card, models, tp))
    return _verdict(fit_profile(profile, cpu_device(memory), models, tp, available=free_at_load(memory)))


def _verdict(a: Assessment | vllm_fit.VllmAssessment) -> Prediction:
    return Prediction(a.verdict.fits, a.verdict.reasons, a)


MEMORY_MODELS: dict[str, MemoryModel] = {
    "exact": MemoryModel(_exact, read_host_memory, needs_host_memory=False, tp_rules=False, checked=False,
                         cpu_from_profile=False, contract_start_rules=True),
    "blocks": MemoryModel(_blocks, None, needs_host_memory=False, tp_rules=True, checked=True,
                          cpu_from_profile=True),  # VLLM_CPU_KVCACHE_SPACE
    "pools": MemoryModel(_pools, read_node_memory, needs_host_memory=True, tp_rules=True, checked=True,
                         cpu_from_profile=False),
}


def memory_model(profile: Profile) -> MemoryModel:
    return MEMORY_MODELS[RUNTIMES[profile.runtime].memory_model]


def predict(profile: Profile, card: GpuKind | None, models: Models, tp: int | None = None,
            memory=None) -> Prediction:
    """`memory`: what `host_memory_reader(profile)` read from the host, when it names one."""
    model = memory_model(profile)
    if model.tp_rules:
        shape = tp_problems(models.target, models.draft, tp or profile.model.tp_size)
        if shape:
            return Prediction(False, tuple(shape), None, shape_refused=True)
    return model.assess(profile, card, models, tp, memory)


def host_memory_reader(profile: Profile) -> Callable | None:
    """What the runtime sizes its memory from on this profile's CPU host, as (remote, unit) ->
    facts; None on a GPU, or for a runtime that reads nothing there."""
    return None if needs_gpu(profile) else memory_model(profile).host_memory


def sizes_from_host_memory(profile: Profile) -> bool:
    """fit needs the host's memory to predict this profile (SGLang on CPU: docs/sglang.md)."""
    return not needs_gpu(profile) and memory_model(profile).needs_host_memory


def checked_on(profile: Profile, host: Host) -> bool:
    """Whether validate's check applies: a memory model fit checks, on a host that declares enough
    GPUs for the profile, or on CPU one whose memory is the profile's own setting."""
    model = memory_model(profile)
    if not model.checked:
        return False
    if not needs_gpu(profile):
        return model.cpu_from_profile
    return host.gpu is not None and host.gpu.count >= profile.model.tp_size
