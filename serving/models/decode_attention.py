"""Attention of a plain decode step for many sequences at once: one new row each, one call per layer.

The sequences' caches are views of one pool ([layers, KV, rows, D]); sequence b's keys are
pool rows [start_b, start_b + length_b] (its committed rows and the new one). Per layer, on fp32
CPU pools the native kernel (serving.kernels.decode_attention) writes each new row and attends
over the rows in place. Elsewhere the PyTorch form: one `index_copy_` writes every new K/V row,
one `index_select` gathers each sequence's keys into a [B, KV, L, D] block padded to the longest
(L = max length + 1), and one SDPA call attends with a mask that hides the padding. Either
replaces B writes and B SDPA calls per layer (and their slicing) with one or three calls.

Computed once per step (`DecodeRows.plan`) and shared by every layer.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from serving.kernels import decode_attention as native


@dataclass(frozen=True)
class DecodeRows:
    pool: object                 # the KVCache all caches are views of
    starts: torch.Tensor         # int64 [B] each sequence's first pool row
    lengths: torch.Tensor        # int64 [B] its rows, the new one included
    in_place: bool               # the native kernel runs; else the PyTorch gather below
    write: torch.Tensor | None = None     # [B] pool row of each sequence's new token
    keys: torch.Tensor | None = None      # [B * L] pool rows of each sequence's keys, padded with its first row
    visible: torch.Tensor | None = None   # bool [B, 1, 1, L]: False on padding
    width: int = 0                        # L

    @staticmethod
    def plan(caches: list, device) -> "DecodeRows | None":
        """For caches that are views of one pool, each taking one new row; None otherwise (and
        for one sequence on the PyTorch form, whose own cache view needs no gather)."""
        pool = caches[0].pool
        if pool is None or any(c.pool is not pool for c in caches):
            return None
        in_place = native.available(pool.k.dtype, pool.k.device)[0]
        if len(caches) == 1 and not in_place:
            return None
        for c in caches:
            if c.length + 1 > c.capacity:
                raise ValueError(f"KV cache full: {c.length + 1} tokens > capacity {c.capacity}")
        starts = torch.tensor([c.pool_start for c in caches], device=device)
        lengths = torch.tensor([c.length + 1 for c in caches], device=device)
        if in_place:
            return DecodeRows(pool, starts, lengths, True)
        width = int(lengths.max())
        offsets = torch.arange(width, device=device)
        visible = offsets[None, :] < lengths[:, None]                              # [B, L]
        keys = starts[:, None] + torch.where(visible, offsets[None, :], 0)
        return DecodeRows(pool, starts, lengths, False, starts + lengths - 1, keys.reshape(-1),
                          visible[:, None, None, :], width)

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q [B, heads, D], k, v [B, KV, D] (the new rows) -> [B, heads * D]."""
        pool_k, pool_v = self.pool.k[layer], self.pool.v[layer]                  # [KV, rows, D]
        if self.in_place:
            return native.attend(q, k, v, pool_k, pool_v, self.starts, self.lengths)
        B, heads, D = q.shape
        KV = k.shape[1]
        pool_k.index_copy_(1, self.write, k.transpose(0, 1))
        pool_v.index_copy_(1, self.write, v.transpose(0, 1))
        keys = pool_k.index_select(1, self.keys).view(KV, B, self.width, D).transpose(0, 1)   # [B, KV, L, D]
        values = pool_v.index_select(1, self.keys).view(KV, B, self.width, D).transpose(0, 1)
        # query head h = kv * G + g: the G heads of one KV head are its G query rows
        out = F.scaled_dot_product_attention(q.view(B, KV, heads // KV, D), keys, values, attn_mask=self.visible)
        return out.reshape(B, heads * D)
