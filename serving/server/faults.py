"""Injected faults, for testing what watches a server (rollout analysis), never for serving.

`DDOPS_SERVING_FAULTS="after=N,error_ratio=R"` in the runtime's environment: the first N
generation requests are served normally (so a deploy gate passes), then a share R of the
following ones fails with a 500, counted in /metrics like any server error. The share is
spread evenly (request i fails when floor(i*R) grows), so a test sees the same ratio on every
run. Unset or empty: no faults.
"""

from __future__ import annotations

import math
import os
import threading
from dataclasses import dataclass

ENV = "DDOPS_SERVING_FAULTS"
KEYS = {"after": int, "error_ratio": float}


@dataclass
class Faults:
    after: int = 0
    error_ratio: float = 0.0
    seen: int = 0  # generation requests so far

    def __post_init__(self) -> None:
        self._lock = threading.Lock()

    def next_fails(self) -> bool:
        """Whether the next generation request fails."""
        if self.error_ratio <= 0:
            return False
        with self._lock:
            self.seen += 1
            past = self.seen - self.after
        return past > 0 and math.floor(past * self.error_ratio) > math.floor((past - 1) * self.error_ratio)

    async def before_generation(self, error: type) -> None:
        """Raises `error(500, ...)` when this request is one to fail."""
        if self.next_fails():
            raise error(500, f"injected fault ({ENV})", code="injected_fault", kind="server_error")


def from_environment(environ=os.environ) -> Faults:
    """Faults from the environment; a malformed value is an error at start, not a silent no-op."""
    text = environ.get(ENV, "").strip()
    if not text:
        return Faults()
    values = {}
    for part in text.split(","):
        key, _, value = part.partition("=")
        key = key.strip()
        if key not in KEYS:
            raise ValueError(f"{ENV}: unknown key {key!r} (known: {', '.join(KEYS)})")
        try:
            values[key] = KEYS[key](value)
        except ValueError:
            raise ValueError(f"{ENV}: {key}: not a number: {value!r}") from None
    faults = Faults(**values)
    if faults.after < 0 or not 0 <= faults.error_ratio <= 1:
        raise ValueError(f"{ENV}: after must be >= 0 and error_ratio in 0..1; got {text!r}")
    return faults
