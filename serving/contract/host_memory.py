"""The host memory the bundled runtime's pool rule sizes from on CPU, parsed from the text of
/proc/meminfo and cgroup limit files (stdlib only): the runtime reads them locally at start
(serving.device_memory), `ddops fit --host` over SSH, and both parse them here.
"""

from __future__ import annotations

UNLIMITED = 1 << 60  # cgroup v1 reports "no limit" as a page-rounded 2**63 - 1


def host_memory(meminfo: str | None, limits: list[int]) -> int | None:
    """MemTotal from /proc/meminfo's text, lowered to the smallest cgroup limit."""
    total = mem_total(meminfo)
    if total is None:
        return min(limits) if limits else None
    return min([total, *limits])


def mem_total(meminfo: str | None) -> int | None:
    for line in (meminfo or "").splitlines():
        name, _, value = line.partition(":")
        if name == "MemTotal":
            return int(value.split()[0]) * 1024       # "24683652 kB"
    return None


def limit_value(text: str | None) -> int | None:
    """A cgroup memory limit file's value: bytes, or None for "max" / unlimited / unreadable."""
    text = (text or "").strip()
    if not text.isdigit() or int(text) >= UNLIMITED:
        return None
    return int(text)
