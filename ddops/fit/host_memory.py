"""The host memory a CPU runtime sizes its K/V pool from, read over SSH.

The bundled runtime: MemTotal, lowered to the unit's MemoryMax= (the limit systemd puts on its
cgroup), parsed by the same stdlib functions the runtime uses on itself at start
(serving.contract.host_memory), and the CPU's flags, which its --dtype auto follows. SGLang's
CPU engine (docs/sglang.md "Memory"): per NUMA node,
the smallest node's MemTotal for its default fraction and MemAvailable / nodes as the memory
free before its weights load; a deploy stops the unit it replaces first, so what that unit
holds now counts as free."""

from __future__ import annotations

from dataclasses import dataclass

from ddops import systemd
from ddops.remote import framing
from serving.contract.host_memory import host_memory, limit_value
from serving.contract.runtime import cpu_flags


@dataclass(frozen=True)
class NodeMemory:
    total: int        # bytes: the smallest NUMA node's MemTotal
    available: int    # bytes: (MemAvailable + the replaced unit's memory) / NUMA nodes
    nodes: int


@dataclass(frozen=True)
class CpuHost:
    """What the bundled runtime reads of its CPU host at start: the memory its pool is sized from
    (None when /proc/meminfo cannot be read) and the CPU's flags, which its --dtype auto follows
    (serving.contract.runtime.auto_dtype)."""
    memory: int | None
    flags: frozenset[str]


def read_host_memory(remote, unit: str) -> CpuHost:
    """The host's memory, lowered to the unit's MemoryMax, and its CPU flags, in one round trip."""
    answers = framing.ask(remote, framing.file("meminfo", "/proc/meminfo"),
                          framing.output("limit", systemd.show(unit, "-p MemoryMax --value") + " 2>/dev/null"),
                          framing.output("flags", "grep -m1 '^flags' /proc/cpuinfo"))
    limit = limit_value(framing.text(answers, "limit"))
    return CpuHost(host_memory(framing.text(answers, "meminfo"), [] if limit is None else [limit]),
                   cpu_flags(framing.text(answers, "flags")))


def read_node_memory(remote, unit: str) -> NodeMemory | None:
    """SGLang's CPU view of the host (see above); None when /proc/meminfo cannot be read."""
    answers = framing.ask(
        remote, framing.file("meminfo", "/proc/meminfo"),
        framing.output("nodes", "head -qn1 /sys/devices/system/node/node[0-9]*/meminfo 2>/dev/null"),
        framing.output("held", systemd.show(unit, "-p MemoryCurrent --value") + " 2>/dev/null"))
    return node_memory(framing.text(answers, "meminfo"), framing.text(answers, "nodes"),
                       framing.text(answers, "held"))


def node_memory(meminfo: str | None, nodes: str | None, held: str | None) -> NodeMemory | None:
    """Pure: the texts read_node_memory asked for ("Node 0 MemTotal: 24683784 kB" per node)."""
    fields = {name.strip(): int(value.split()[0]) * 1024 for name, _, value in
              (line.partition(":") for line in (meminfo or "").splitlines()) if value.split()}
    if "MemTotal" not in fields or "MemAvailable" not in fields:
        return None
    totals = [int(line.split()[3]) * 1024 for line in (nodes or "").splitlines()
              if len(line.split()) >= 4 and line.split()[2] == "MemTotal:"]
    count = max(1, len(totals))
    freed = limit_value(held) or 0
    return NodeMemory(min(totals) if totals else fields["MemTotal"] // count,
                      (fields["MemAvailable"] + freed) // count, count)
