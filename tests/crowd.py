"""Run calls at the same time, as concurrent users would: each in its own thread, results in order."""

from __future__ import annotations

import threading
from typing import Callable, TypeVar

T = TypeVar("T")


def at_once(calls: list[Callable[[], T]], timeout: float = 120) -> list[T]:
    results: list = [None] * len(calls)
    threads = [threading.Thread(target=lambda i=i: results.__setitem__(i, calls[i]())) for i in range(len(calls))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=timeout)
    return results
