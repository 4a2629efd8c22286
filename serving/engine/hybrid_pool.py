"""HybridPool: the batch runner's pool for a hybrid target: KV rows plus a state slot per sequence.

K/V rows over the full-attention layers only, lent as contiguous ranges exactly as KVPool
lends them; beside them, one preallocated Gated DeltaNet state slot per running sequence
(conv [slots, n, K-1, C] in the runtime dtype, recurrent [slots, n, Hv, dk, dv] fp32, n linear
layers), so a batched decode step gathers and scatters every sequence's state by slot index.
A reservation is a `HybridCache` view over its rows and its slot, zeroed for a new sequence.
serving.memory counts both (prediction = measurement).
"""

from __future__ import annotations

from serving.engine.kv_pool import KVPool
from serving.models.hybrid_cache import HybridCache, new_states, state_bytes


class HybridPool(KVPool):
    def __init__(self, config, tokens: int, sequences: int, dtype, device):
        super().__init__(config, tokens, dtype, device)
        self.conv, self.recurrent = new_states(config, (sequences,), dtype, device)
        self.free_slots = list(range(sequences))

    def state_bytes(self) -> int:
        return state_bytes(self.conv, self.recurrent)

    def reserve(self, rows: int) -> HybridCache | None:
        """A cache over `rows` pool rows and a free state slot, or None while either is missing."""
        if not self.free_slots:
            return None
        kv = super().reserve(rows)
        if kv is None:
            return None
        view = HybridCache.over(kv, self.conv, self.recurrent, self.free_slots.pop(0))
        view.truncate(0)                      # a new sequence starts from the zero state
        return view

    def release(self, view: HybridCache) -> None:
        self.state_seconds += view.state_seconds
        super().release(view.kv)
        self.free_slots.append(view.slot)
        self.free_slots.sort()


def pool_for(target, tokens: int, sequences: int) -> KVPool:
    """The runner's pool: K/V rows for every target; a hybrid (linear-attention layers) adds a
    state slot for each of `sequences` running sequences."""
    if target.config.linear_layers:
        return HybridPool(target.config, tokens, sequences, target.dtype, target.device)
    return KVPool(target.config, tokens, target.kv_dtype, target.device)
