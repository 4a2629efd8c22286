"""KVPool: one preallocated target KV cache of `tokens` rows, lent out as contiguous ranges.

Each admitted sequence reserves prompt + max_new_tokens + verify rows up front and gets a
`KVCache` over its own slice, so every per-sequence code path (prefill, a speculative round
with `keep(path)`) runs unchanged and a running sequence can never run out of room: there is
nothing to preempt. Ranges are first-fit over a sorted free list; freeing merges neighbours.
"""

from __future__ import annotations

from serving.models.kv_cache import KVCache


class KVPool(KVCache):
    """The whole pool is itself a KVCache over the full-attention layers."""

    state_seconds = 0.0   # a hybrid's: planning rows + committing states of released sequences (benchmarks)

    def __init__(self, config, tokens: int, dtype, device):
        super().__init__(*KVCache.dims(config), tokens, dtype, device)
        self.free: list[tuple[int, int]] = [(0, tokens)]      # (start, end), sorted, disjoint

    def state_bytes(self) -> int:
        """A dense target keeps no recurrent state (serving.engine.hybrid_pool's does)."""
        return 0

    @property
    def free_tokens(self) -> int:
        return sum(end - start for start, end in self.free)

    def reserve(self, rows: int) -> KVCache | None:
        """A cache over `rows` contiguous pool rows, or None while no free range is that long."""
        for i, (start, end) in enumerate(self.free):
            if end - start >= rows:
                self.free[i:i + 1] = [(start + rows, end)] if end - start > rows else []
                return self.rows(start, rows)
        return None

    def release(self, view: KVCache) -> None:
        start = view.pool_start
        ranges = sorted(self.free + [(start, start + view.capacity)])
        merged: list[tuple[int, int]] = []
        for begin, end in ranges:
            if merged and merged[-1][1] == begin:
                merged[-1] = (merged[-1][0], end)
            else:
                merged.append((begin, end))
        self.free = merged
