"""Is the GPU free? Read over SSH with nvidia-smi; hosts without it (CPU lab hosts) say so.

SGLang applies --mem-fraction-static to the memory that is free when it starts, so a stray
process still holding the card silently shrinks the new server: check after stop, before start.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

QUERY = ("command -v nvidia-smi >/dev/null 2>&1 || { echo NO-NVIDIA-SMI; exit 0; }; "
         "nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv,noheader,nounits")
ABSENT = "NO-NVIDIA-SMI"


@dataclass(frozen=True)
class GpuProcess:
    pid: int
    name: str
    used_mib: int


@dataclass(frozen=True)
class GpuCheck:
    status: str  # free, busy, absent (no nvidia-smi on the host), error
    processes: tuple[GpuProcess, ...]
    detail: str

    @property
    def may_start(self) -> bool:
        return self.status in ("free", "absent")

    def as_dict(self) -> dict:
        return {"status": self.status, "detail": self.detail,
                "processes": [asdict(p) for p in self.processes]}


def parse_compute_apps(text: str) -> tuple[GpuProcess, ...]:
    """`pid, name, MiB` lines of --query-compute-apps (noheader, nounits)."""
    found = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < 3 or not parts[0].isdigit():
            continue
        used = parts[-1]
        found.append(GpuProcess(int(parts[0]), ",".join(parts[1:-1]),
                                int(used) if used.isdigit() else 0))
    return tuple(found)


def judge_output(exit_code: int, stdout: str, stderr: str) -> GpuCheck:
    if stdout.strip() == ABSENT:
        return GpuCheck("absent", (), "no nvidia-smi on this host (no GPU to check); going on")
    if exit_code != 0:
        reason = (stderr.strip() or stdout.strip() or f"exit {exit_code}").splitlines()[-1]
        return GpuCheck("error", (), f"nvidia-smi failed: {reason}")
    processes = parse_compute_apps(stdout)
    if not processes:
        return GpuCheck("free", (), "no compute processes on the GPU")
    held = ", ".join(f"pid {p.pid} {p.name} ({p.used_mib} MiB)" for p in processes)
    return GpuCheck("busy", processes, f"GPU still held by {held}")


def wait_free(remote, timeout_s: float = 60.0, poll_s: float = 2.0) -> GpuCheck:
    """Poll until free (a stopped server's processes take a moment to exit) or timeout."""
    deadline = time.monotonic() + timeout_s
    while True:
        result = remote.run(QUERY, check=False, timeout=30)
        check = judge_output(result.exit_code, result.stdout, result.stderr)
        if check.status != "busy" or time.monotonic() >= deadline:
            return check
        time.sleep(poll_s)


FREE_QUERY = ("command -v nvidia-smi >/dev/null 2>&1 || { echo NO-NVIDIA-SMI; exit 0; }; "
              "nvidia-smi --query-gpu=memory.free --format=csv,noheader,nounits")


def parse_free_mib(text: str) -> int | None:
    """Smallest free memory over the host's cards (MiB); None without nvidia-smi or numbers.

    The smallest, because a tensor-parallel server needs its share on every card."""
    values = [int(line.strip()) for line in text.splitlines() if line.strip().isdigit()]
    return min(values) if values else None


def free_mib(remote) -> int | None:
    result = remote.run(FREE_QUERY, check=False, timeout=30)
    return parse_free_mib(result.stdout) if result.exit_code == 0 else None
