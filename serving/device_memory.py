"""What the runtime reads of its own host at start: how much memory the device it serves from
has, for the pool rule (serving.contract.runtime.pool_rows), and the CPU's flags, for its
--dtype auto (serving.contract.runtime.auto_dtype) and the native kernels' build cache.

CPU: the host's MemTotal, or less where a cgroup limits this process (a systemd unit's
MemoryMax= is its cgroup's memory.max; v1's memory.limit_in_bytes is read too), the lowest
limit on the way to the root. Total, not MemAvailable: the pool's pages are committed as rows
are first written, so the cap bounds what a full pool will need against what the host has, and
the figure is a fact of the host that `ddops fit` can read before a start, not a moment's state.
CUDA: the card's free memory before the weights load, as SGLang measures it (its `pre`).
"""

from __future__ import annotations

from pathlib import Path

from serving.contract.host_memory import host_memory, limit_value
from serving.contract.runtime import cpu_flags

CGROUP_ROOT = Path("/sys/fs/cgroup")


def device_memory(device: str) -> int | None:
    """Bytes the pool rule sizes from on `device` ("cpu" or "cuda"), None where unreadable."""
    if device == "cuda":
        import torch

        return int(torch.cuda.mem_get_info()[0])
    return host_memory(_read("/proc/meminfo"), _cgroup_limits(_read("/proc/self/cgroup")))


def host_cpu_flags() -> frozenset[str]:
    """This host's CPU flags (/proc/cpuinfo), the same parse ddops fit applies to a remote host's."""
    return cpu_flags(_read("/proc/cpuinfo"))


def _cgroup_limits(self_cgroup: str | None) -> list[int]:
    """Limits on every cgroup from this process's up to the root, v2 and v1."""
    found = []
    for line in (self_cgroup or "").splitlines():
        _, controllers, path = line.split(":", 2)
        if controllers == "":
            files, base = ("memory.max",), CGROUP_ROOT
        elif "memory" in controllers.split(","):
            files, base = ("memory.limit_in_bytes",), CGROUP_ROOT / "memory"
        else:
            continue
        for directory in _ancestors(base, path):
            for name in files:
                value = limit_value(_read(directory / name))
                if value is not None:
                    found.append(value)
    return found


def _ancestors(base: Path, path: str) -> list[Path]:
    parts = [p for p in path.split("/") if p]
    return [base.joinpath(*parts[:i]) for i in range(len(parts), -1, -1)]


def _read(path) -> str | None:
    try:
        return Path(path).read_text()
    except OSError:
        return None
