"""Attention of the rows that are not a prompt: a plain decode step's (one new row per sequence)
and a verify pass's (a chain's or a tree's rows), for many sequences at once, one call per layer.

On fp32 or bf16 CPU pools the native kernel (serving.kernels.decode_attention) attends every such row
over its keys in place (`NativeRows`): a decode row over its sequence's rows, a chain row over the
rows before it and itself, a tree row over the committed rows and its ancestors and itself. The
kernel gives a row the same bits whichever of these it is, so a token a verify pass accepts has
the hidden state plain decoding would have given it, layer after layer, and speculative output
equals plain output at T=0 exactly, not only up to ties (with bf16 products that round their
inputs, attention's last-bit differences between SDPA's verify rows and the kernel's decode rows
changed greedy tokens: docs/serving.md "bf16 on CPU"). Prompt chunks longer than CHAIN_ROWS keep
SDPA's causal path (its flash kernel; a prompt is computed the same way whatever method follows).

The sequences' caches are views of one pool ([layers, KV, rows, D]); sequence b's keys are
pool rows [start_b, start_b + length_b] (its committed rows and the new one). Where the kernel
does not serve the pool, a plain decode step takes the PyTorch form (`DecodeRows`): three calls a
layer for the batch in place of B writes and B SDPA calls (and their slicing).

Each plan is computed once per forward and shared by every layer.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from serving.kernels import decode_attention as native

CHAIN_ROWS = 32     # causal rows (a chain's verify, a short prompt chunk) the kernel takes; longer: SDPA


@dataclass(frozen=True)
class NativeRows:
    """The rows of one forward the native kernel attends (`plan`), computed once and shared by
    every layer; the other sequences' rows (long prompt chunks) go through SDPA."""

    pool: object                 # the KVCache all caches are views of
    rows: torch.Tensor | None    # int64 [B] rows of the forward it takes; None: all of them
    sequences: frozenset         # the sequences whose rows those are
    writes: torch.Tensor         # int64 [B] the pool row each new K/V goes to
    starts: torch.Tensor         # int64 [B] each row's first key: its sequence's first pool row
    prefix: torch.Tensor         # int64 [B] its contiguous keys from there
    extra_offsets: torch.Tensor  # int64 [B + 1] into extra_rows
    extra_rows: torch.Tensor     # int64 [E] a tree row's ancestors' and its own pool rows, in order

    @staticmethod
    def plan(caches: list, counts: list[int], tree_masks: list, rows_dtype: torch.dtype, device) -> "NativeRows | None":
        """For caches that are views of one pool the kernel serves, rows of `rows_dtype`: every
        sequence's rows that are one decode row, a causal chain of at most CHAIN_ROWS, or a tree;
        None when none are."""
        pool = caches[0].pool
        if pool is None or any(c.pool is not pool for c in caches) or not native.available(
                pool.k.dtype, pool.k.device, rows_dtype)[0]:
            return None
        writes, starts, prefix, counts_extra, extra, rows, sequences = [], [], [], [], [], [], set()
        first = 0
        for b, (cache, n, mask) in enumerate(zip(caches, counts, tree_masks)):
            if mask is not None or n <= CHAIN_ROWS:
                if cache.length + n > cache.capacity:
                    raise ValueError(f"KV cache full: {cache.length + n} tokens > capacity {cache.capacity}")
                base = cache.pool_start + cache.length
                writes += range(base, base + n)
                starts += [cache.pool_start] * n
                rows += range(first, first + n)
                sequences.add(b)
                if mask is None:        # decode row or chain: contiguous keys up to the row itself
                    prefix += range(cache.length + 1, cache.length + n + 1)
                    counts_extra += [0] * n
                else:                   # tree: committed rows, then its ancestors and itself
                    prefix += [cache.length] * n
                    seen = mask.nonzero()                                   # [(row, ancestor)], sorted
                    extra.append(seen[:, 1].to(torch.int64) + base)
                    counts_extra += mask.sum(1).tolist()
            first += n
        if not rows:
            return None
        as_long = lambda values: torch.tensor(values, dtype=torch.int64)  # noqa: E731
        offsets = torch.zeros(len(rows) + 1, dtype=torch.int64)
        offsets[1:] = as_long(counts_extra).cumsum(0)
        everything = len(rows) == first
        return NativeRows(pool, None if everything else as_long(rows).to(device), frozenset(sequences),
                          as_long(writes), as_long(starts), as_long(prefix), offsets,
                          torch.cat(extra).cpu() if extra else torch.zeros(0, dtype=torch.int64))

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q [B, heads, D], k, v [B, KV, D], the rows it takes -> [B, heads * D]."""
        return native.attend_rows(q, k, v, self.pool.k[layer], self.pool.v[layer], self.writes, self.starts,
                                  self.prefix, self.extra_offsets, self.extra_rows)


@dataclass(frozen=True)
class DecodeRows:
    """A plain decode step's rows where the native kernel does not serve the pool: one
    `index_copy_` writes every new K/V row, one `index_select` gathers each sequence's keys into a
    [B, KV, L, D] block padded to the longest (L = max length + 1), and one SDPA call attends
    with a mask that hides the padding."""

    pool: object                 # the KVCache all caches are views of
    write: torch.Tensor          # [B] pool row of each sequence's new token
    keys: torch.Tensor           # [B * L] pool rows of each sequence's keys, padded with its first row
    visible: torch.Tensor        # bool [B, 1, 1, L]: False on padding
    width: int                   # L

    @staticmethod
    def plan(caches: list, rows_dtype: torch.dtype, device) -> "DecodeRows | None":
        """For two or more caches that are views of one pool, each taking one new row of
        `rows_dtype`, where the native kernel does not serve them (NativeRows does where it does);
        None otherwise."""
        pool = caches[0].pool
        if (len(caches) == 1 or pool is None or any(c.pool is not pool for c in caches)
                or native.available(pool.k.dtype, pool.k.device, rows_dtype)[0]):
            return None
        for c in caches:
            if c.length + 1 > c.capacity:
                raise ValueError(f"KV cache full: {c.length + 1} tokens > capacity {c.capacity}")
        starts = torch.tensor([c.pool_start for c in caches], device=device)
        lengths = torch.tensor([c.length + 1 for c in caches], device=device)
        width = int(lengths.max())
        offsets = torch.arange(width, device=device)
        visible = offsets[None, :] < lengths[:, None]                              # [B, L]
        keys = starts[:, None] + torch.where(visible, offsets[None, :], 0)
        return DecodeRows(pool, starts + lengths - 1, keys.reshape(-1), visible[:, None, None, :], width)

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q [B, heads, D], k, v [B, KV, D] (the new rows) -> [B, heads * D]."""
        pool_k, pool_v = self.pool.k[layer], self.pool.v[layer]                  # [KV, rows, D]
        B, heads, D = q.shape
        KV = k.shape[1]
        pool_k.index_copy_(1, self.write, k.transpose(0, 1).to(pool_k.dtype))     # rounded where the rows are bf16
        pool_v.index_copy_(1, self.write, v.transpose(0, 1).to(pool_v.dtype))
        keys = pool_k.index_select(1, self.keys).view(KV, B, self.width, D).transpose(0, 1).to(q.dtype)  # [B, KV, L, D]
        values = pool_v.index_select(1, self.keys).view(KV, B, self.width, D).transpose(0, 1).to(q.dtype)
        # query head h = kv * G + g: the G heads of one KV head are its G query rows
        out = F.scaled_dot_product_attention(q.view(B, KV, heads // KV, D), keys, values, attn_mask=self.visible)
        return out.reshape(B, heads * D)
