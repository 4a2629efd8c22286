"""Known GPU kinds and their memory, as `nvidia-smi --query-gpu=memory.total` reports it.

The marketing size (48 GB) is not what a process can address: an RTX A6000 reports 49,140 MiB,
an L40S 46,068 MiB (ECC on). Names are matched loosely ("RTX A6000", "NVIDIA RTX A6000",
"a6000") so an inventory's `gpu.kind` and nvidia-smi's name both find their row.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

MIB = 1 << 20
GIB = 1 << 30


@dataclass(frozen=True)
class GpuKind:
    name: str
    memory_mib: int  # memory.total per card
    aliases: tuple[str, ...] = ()

    @property
    def memory_bytes(self) -> int:
        return self.memory_mib * MIB


GPU_KINDS: tuple[GpuKind, ...] = (
    GpuKind("RTX A6000", 49140, ("a6000", "nvidia rtx a6000")),
    GpuKind("RTX 6000 Ada", 49140, ("rtx 6000 ada generation", "6000 ada")),
    GpuKind("L40S", 46068, ("nvidia l40s",)),
    GpuKind("L40", 46068, ("nvidia l40",)),
    GpuKind("A100 40GB", 40960, ("a100-40", "a100 40", "a100-sxm4-40gb", "a100-pcie-40gb")),
    GpuKind("A100 80GB", 81920, ("a100-80", "a100 80", "a100-sxm4-80gb", "a100 80gb pcie")),
    GpuKind("H100 80GB", 81559, ("h100", "h100-80", "h100 80gb hbm3", "h100-sxm5-80gb")),
    GpuKind("H200", 143771, ("h200 141gb", "nvidia h200")),
    GpuKind("RTX 4090", 24564, ("geforce rtx 4090", "4090")),
    GpuKind("L4", 23034, ("nvidia l4",)),
)


def _norm(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", " ", text.lower().replace("nvidia", "")).strip()


def find_gpu(kind: str) -> GpuKind | None:
    """The table row for a name (any spelling in the table), or None."""
    wanted = _norm(kind)
    for gpu in GPU_KINDS:
        if wanted in {_norm(gpu.name), *(_norm(a) for a in gpu.aliases)}:
            return gpu
    return None


def gpu_from_gib(memory_gib: float, name: str | None = None) -> GpuKind:
    """A card given only by its memory (--gpu-mem-gib N, or an inventory's memory_gb)."""
    return GpuKind(name or f"{memory_gib:g} GiB GPU", int(round(memory_gib * 1024)))


def known_names() -> str:
    return ", ".join(g.name for g in GPU_KINDS)
