"""HybridCache: one sequence's state for a hybrid target, with KVCache's commit/keep contract.

Full-attention layers keep K/V in a KVCache (over those layers only). Each Gated DeltaNet layer
keeps a conv state (the last K-1 conv inputs, [K-1, C], model dtype) and a recurrent state
([Hv, dk, dv], fp32). `forward` never changes the committed state: each linear layer stages
its new rows' conv inputs and per-row states; the caller then commits the last row
(`commit(T)`) or a tree path (`keep(path)`), whose last row's state becomes the sequence's.
By-depth forwards stage every row's state (snapshot: commit is a copy); chunked chains stage
the final state and their per-row inputs (commit of a shorter prefix recomputes it), unless
the forward said only all its rows can be committed (`begin(rows, prefixes=False)`: a prefill,
whose caller reads the last row's logits only): then just the last K-1 conv inputs and the
final state stay, and the per-row tensors ([T, H, dk] and [T, C] per layer) go with the layer's
activations. Staged tensors are transient (the verify pass's activations), not preallocated.

In the batch runner a cache is a view (`over`): K/V rows of the pool's full-attention KV and
state slot `slot` of its stacked conv/recurrent tensors. A batched decode step
(serving.models.hybrid_batched) advances every sequence's state in place and marks the row
`advanced`; the caller's `commit(1)` then accepts its K/V, as for a dense cache.
"""

from __future__ import annotations

import time

import torch

from serving.models.delta_rule import chunked_delta_rule
from serving.models.kv_cache import KVCache
from serving.models.linear_rows import Rows


def new_states(config, slots: tuple[int, ...], dtype: torch.dtype, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Zeroed Gated DeltaNet states of n = len(config.linear_layers) layers, after leading dims
    `slots` ((): one sequence; (S,): a pool's S slots): conv [*slots, n, K-1, C] in `dtype`,
    recurrent [*slots, n, Hv, dk, dv] fp32."""
    L, n = config.linear, len(config.linear_layers)
    conv = torch.zeros(*slots, n, L.conv_kernel - 1, L.conv_dim, dtype=dtype, device=device)
    recurrent = torch.zeros(*slots, n, L.num_value_heads, L.key_head_dim, L.value_head_dim,
                            dtype=torch.float32, device=device)
    return conv, recurrent


def state_bytes(conv: torch.Tensor, recurrent: torch.Tensor) -> int:
    return sum(t.numel() * t.element_size() for t in (conv, recurrent))


class HybridCache:
    def __init__(self, config, capacity: int, dtype: torch.dtype, device):
        self.kernel = config.linear.conv_kernel
        self.kv = KVCache.for_model(config, capacity, dtype, device)
        self.conv, self.recurrent = new_states(config, (), dtype, device)
        self._fresh(self.conv.shape[0])

    def _fresh(self, n: int) -> None:
        self.rows: Rows | None = None
        self.prefixes = True       # the forward being staged may commit fewer than all its rows
        self.staged: list = [None] * n
        self.advanced = 0          # rows a batched step already advanced the state by
        self.slot = self.pool_conv = self.pool_recurrent = None   # views only: their pool's slot
        self.state_seconds = 0.0   # planning rows + committing states (the benchmark reads it)

    @classmethod
    def over(cls, kv: KVCache, pool_conv: torch.Tensor, pool_recurrent: torch.Tensor, slot: int) -> "HybridCache":
        """A view: kv over pool rows; state slot `slot` of pool_conv [slots, n, K-1, C] and
        pool_recurrent [slots, n, H, dk, dv]."""
        cache = cls.__new__(cls)
        cache.kernel, cache.kv = pool_conv.shape[2] + 1, kv
        cache.conv, cache.recurrent = pool_conv[slot], pool_recurrent[slot]
        cache._fresh(pool_conv.shape[1])
        cache.slot, cache.pool_conv, cache.pool_recurrent = slot, pool_conv, pool_recurrent
        return cache

    @property
    def length(self) -> int:
        return self.kv.length

    @property
    def capacity(self) -> int:
        return self.kv.capacity

    @property
    def pool_start(self) -> int:
        """A view's first row of its pool's K/V (the draft context takes the same rows)."""
        return self.kv.pool_start

    def state_bytes(self) -> int:
        return state_bytes(self.conv, self.recurrent)

    def write(self, slot: int, k: torch.Tensor, v: torch.Tensor):
        return self.kv.write(slot, k, v)

    def begin(self, rows: Rows, prefixes: bool = True) -> None:
        """A forward of `rows` starts; prefixes: whether a commit may accept fewer than all of them."""
        self.rows, self.prefixes = rows, prefixes
        self.staged = [None] * len(self.staged)

    def stage(self, slot: int, inputs: torch.Tensor, states: torch.Tensor, replay=None) -> None:
        """inputs [K-1 + T, C]: committed conv columns then the new rows' conv inputs;
        states [T + 1, H, dk, dv] per row (stepwise) or the final state [H, dk, dv] (chunked);
        replay: (k, v, g, beta) of a chunked chain, to recompute a shorter accepted prefix."""
        if not (self.rows.stepwise or self.prefixes):
            # the last row's conv window, copied so the [K-1 + T, C] inputs are not kept alive
            inputs, replay = inputs[inputs.shape[0] - self.kernel + 1:].clone(), None
        self.staged[slot] = (inputs, states, replay)

    def commit(self, count: int) -> None:
        """Accept the `count` rows just written (a causal chain): the state after row count-1."""
        if self.advanced:
            if count != self.advanced:
                raise ValueError(f"a batched step advanced the state by {self.advanced} rows, not {count}")
            self.advanced = 0
        else:
            self._settle(count - 1)
        self.kv.commit(count)

    def keep(self, path) -> None:
        """Accept the tree path `path` (rows, root first; list or tensor): the state after its last row."""
        self._settle(int(path[-1]))
        self.kv.keep(path)

    def truncate(self, length: int) -> None:
        """0 starts a new sequence; a recurrent state cannot roll back to any other length."""
        if length == 0:
            self.conv.zero_()
            self.recurrent.zero_()
            self.staged, self.advanced = [None] * len(self.staged), 0
        elif length != self.length:
            raise ValueError(f"a hybrid cache cannot roll back from {self.length} to {length} tokens "
                             "(recurrent state); commit a prefix with keep(path) instead")
        self.kv.truncate(length)

    def _settle(self, row: int) -> None:
        began = time.perf_counter()
        rows = self.rows
        if rows is None or any(s is None for s in self.staged):
            raise ValueError("nothing staged to commit: run forward first")
        if not (rows.stepwise or row == rows.count - 1 or self.prefixes):
            raise ValueError(f"this forward can commit all its {rows.count} rows only, not {row + 1} "
                             "(it ran with last_only)")
        window = rows.conv_window(row, self.kernel)
        for slot, (inputs, states, replay) in enumerate(self.staged):
            if rows.stepwise:
                self.conv[slot], self.recurrent[slot] = inputs[window], states[row + 1]
            elif row == rows.count - 1:   # the last K-1 inputs, whether all were kept or only they
                self.conv[slot], self.recurrent[slot] = inputs[inputs.shape[0] - self.kernel + 1:], states
            else:   # a chain prefix of a chunked forward: recompute it from the committed state
                k, v, g, beta = (t[: row + 1] for t in replay)
                self.conv[slot] = inputs[window]
                # the state never reads q: k stands in for it (the output o is discarded)
                self.recurrent[slot] = chunked_delta_rule(k, k, v, g, beta, self.recurrent[slot])[1]
        self.rows, self.staged = None, [None] * len(self.staged)
        self.state_seconds += time.perf_counter() - began
