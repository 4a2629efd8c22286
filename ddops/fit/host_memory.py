"""The host memory the bundled runtime's pool rule caps from on CPU, read over SSH: MemTotal,
lowered to the unit's MemoryMax= (the limit systemd puts on its cgroup). Parsed by the same
stdlib functions the runtime uses on itself at start (serving.contract.host_memory)."""

from __future__ import annotations

from ddops import systemd
from ddops.remote import framing
from serving.contract.host_memory import host_memory, limit_value


def read_host_memory(remote, unit: str) -> int | None:
    """Bytes, or None when the host's /proc/meminfo cannot be read."""
    answers = framing.ask(remote, framing.file("meminfo", "/proc/meminfo"),
                          framing.output("limit", systemd.show(unit, "-p MemoryMax --value") + " 2>/dev/null"))
    limit = limit_value(framing.text(answers, "limit"))
    return host_memory(framing.text(answers, "meminfo"), [] if limit is None else [limit])
