"""A profile on a kind of GPU -> the planner's Setup, and the checks validate and deploy run.

Reads capabilities, never method names: a method that verifies a tree verifies budget + 1
tokens per round (DDTree's verify graphs are that wide), a chain verifies the draft block.
"""

from __future__ import annotations

import posixpath
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ddops.fit.gpus import MIB, GpuKind, find_gpu, gpu_from_gib
from ddops.fit.memory import Setup
from ddops.fit.model import ModelFacts
from ddops.fit.verdict import Assessment, assess
from ddops.inventory import Host
from ddops.profile import RUNTIMES, Profile
from ddops.profile.extra_args import int_value
from ddops.profile.runtimes import POOL_CAP_FLAG

DEFAULT_BLOCK = 16  # SGLang's fallback when the draft config has no block_size
MAX_PREFILL_TOKENS = 16384  # SGLang's --max-prefill-tokens default
KV_DTYPES = {"bf16": "bfloat16", "bfloat16": "bfloat16", "fp8_e5m2": "fp8_e5m2", "fp8_e4m3": "fp8_e4m3",
             "fp4_e2m1": "fp4_e2m1", "mxfp8": "fp8_e4m3", "nvfp4": "fp4_block16", "fp4_mx_block16": "fp4_block16"}

Reader = Callable[[str], ModelFacts]  # model path -> facts (local, a copy, or over SSH)


@dataclass(frozen=True)
class Models:
    target: ModelFacts
    draft: ModelFacts | None


def needs_gpu(profile: Profile) -> bool:
    return RUNTIMES[profile.runtime].wants_gpu(profile.service.device)


def read_models(profile: Profile, read: Reader) -> Models:
    draft = profile.speculative.draft_model_path if profile.method.needs_draft else None
    return Models(read(profile.model.path), read(draft) if draft else None)


def setup_for(profile: Profile, gpu: GpuKind, models: Models, tp: int | None = None,
              available: int | None = None) -> Setup:
    memory, mamba = profile.memory, profile.mamba
    weights_dtype = profile.model.dtype if profile.model.dtype != "auto" else models.target.dtype
    kv_dtype = KV_DTYPES.get(memory.kv_cache_dtype, weights_dtype)
    return Setup(
        gpu=gpu, tp=tp or profile.model.tp_size, fraction=memory.mem_fraction_static,
        context_length=memory.context_length or models.target.max_position_embeddings,
        weights_dtype=weights_dtype, kv_dtype=kv_dtype,
        max_running_requests=memory.max_running_requests,
        # -1 turns chunking off: a whole prompt prefills at once, up to --max-prefill-tokens
        chunked_prefill_size=MAX_PREFILL_TOKENS if memory.chunked_prefill_size == -1 else memory.chunked_prefill_size,
        cuda_graphs=profile.cuda_graph.enabled, graph_max_bs=profile.cuda_graph.max_bs,
        verify_tokens=verify_tokens(profile, models.draft),
        mamba_slots=mamba.max_mamba_cache_size, ssm_dtype=mamba.ssm_dtype,
        mamba_ratio=mamba.full_memory_ratio, mamba_strategy=mamba.scheduler_strategy,
        max_total_tokens=int_value(profile, POOL_CAP_FLAG), available=available,
        sglang_version=profile.sglang_version,
    )


def verify_tokens(profile: Profile, draft: ModelFacts | None) -> int:
    """Tokens the target verifies per round, by the contract's one rule (Method.verify_rows,
    which the bundled runtime sizes its verify rows by): 0 plain, the block for a chain, the
    budget + 1 for a tree (never fewer than the block)."""
    method, spec = profile.method, profile.speculative
    block = spec.block_size or (draft.block_size if draft else None) or DEFAULT_BLOCK
    return method.verify_rows(block, spec.ddtree_budget)


def fit_profile(profile: Profile, gpu: GpuKind, models: Models, tp: int | None = None,
                available: int | None = None) -> Assessment:
    return assess(setup_for(profile, gpu, models, tp, available), models.target, models.draft)


# What SGLang 0.5.15's CPU engine holds before it measures the memory free for its weights:
# its HTTP/tokenizer, detokenizer and scheduler processes, each importing torch. Measured as
# MemAvailable at ddops's read less the "Load weight begin. avail mem" it logs: 1.20-1.41 GiB
# over four starts on a quiet lab host (docs/sglang.md "Memory").
SGLANG_CPU_START = int(1.3 * (1 << 30))


def free_at_load(memory) -> int:
    """The memory SGLang's CPU engine will find free before its weights load (NodeMemory)."""
    return max(0, memory.available - SGLANG_CPU_START)


def cpu_device(memory) -> GpuKind:
    """A CPU host's NUMA node as the pool arithmetic's device (host_memory.NodeMemory)."""
    return GpuKind(f"CPU ({memory.nodes} NUMA node{'s' if memory.nodes > 1 else ''})", memory.total // MIB)


def host_gpu(host: Host) -> GpuKind | None:
    """The host's card: the table row for its kind, else its declared memory."""
    if host.gpu is None:
        return None
    return find_gpu(host.gpu.kind) or gpu_from_gib(host.gpu.memory_gb, host.gpu.kind)


def local_reader(models_dir: Path | None = None) -> Reader:
    """Read checkpoints on this machine: from `models_dir`/<basename> when given, else the path."""
    from ddops.fit.read import read_model
    from ddops.checkpoint import LocalFiles

    def read(path: str) -> ModelFacts:
        where = str(models_dir / posixpath.basename(path.rstrip("/"))) if models_dir else path
        return read_model(LocalFiles(), where)
    return read


def remote_reader(remote) -> Reader:
    from ddops.fit.read import read_model
    from ddops.checkpoint import RemoteFiles
    return lambda path: read_model(RemoteFiles.of(remote), path)
