"""DFlash drafting for many sequences at once: one draft pass over every sequence's block.

Each sequence owns a `DraftContext`: its draft K/V (projected target features of its committed
tokens, slot = position), a range of one preallocated draft pool (`BatchDrafter.pool`), and the
features not yet projected. `BatchDrafter.absorb`
projects the pending features of all sequences in one pass; `propose` runs every sequence's
block [bonus, MASK x depth_b] packed back to back ([N] = sum of depth_b + 1 rows) through the
draft layers, the one-sequence `DraftLayer`s: projections and MLP once over [1, N, H], and an
`Attend` that runs each sequence's rows over its own context and block under the one-sequence
masks (`DFlashDraftModel.masks`, built once a round), so blocks of different depths need no
padding and never see each other.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from serving.models.kv_cache import KVCache
from serving.models.packing import row_slices

from .draft_model import Attend, attend_after, cached_store
from .preflight import check_captured


class DraftContext:
    """One sequence's draft context: K/V of `length` committed positions plus pending features.

    cache: its rows of the draft pool; a round writes its block after the context, so the
    context needs as many rows as the target's reservation (committed tokens + one verify pass)."""

    def __init__(self, cache: KVCache):
        self.cache = cache
        self.pending: list[torch.Tensor] = []          # [n, feature_width] each, in order

    @property
    def length(self) -> int:
        return self.cache.length

    @property
    def pending_rows(self) -> int:
        return sum(f.shape[0] for f in self.pending)


class BatchDrafter:
    """The batched form of a `DFlashDrafter` (same weights, LM head rows and vocabulary)."""

    def __init__(self, drafter):
        self.model, self.target, self.cfg = drafter.model, drafter.target, drafter.cfg
        self.needs, self.feature_width, self.vocab = drafter.needs, drafter.feature_width, drafter.vocab
        self.head, self.device = drafter.head, drafter.device
        self.mask_id = self.cfg.mask_token_id

    def pool(self, rows: int) -> KVCache:
        """The draft's K/V pool: `rows` rows over the draft's layers, allocated once."""
        cfg = self.cfg
        return KVCache(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, rows, self.model.dtype, self.device)

    @staticmethod
    def context(pool: KVCache, start: int, rows: int) -> DraftContext:
        """A new sequence's context over pool rows [start, start + rows)."""
        return DraftContext(pool.rows(start, rows))

    def extend(self, context: DraftContext, features: torch.Tensor) -> None:
        """Target features [n, feature_width] of the sequence's next n committed tokens."""
        check_captured(features.shape[-1], self.feature_width, len(self.cfg.target_layer_ids))
        context.pending.append(features)

    @torch.inference_mode()
    def absorb(self, contexts: list[DraftContext]) -> None:
        """Project every pending feature row and cache its K/V at the sequence's next positions."""
        contexts = [c for c in contexts if c.pending]
        if not contexts:
            return
        counts = [c.pending_rows for c in contexts]
        features = torch.cat([f for c in contexts for f in c.pending])        # [C, F]
        positions = torch.cat([torch.arange(c.length, c.length + n, device=self.device)
                               for c, n in zip(contexts, counts)])
        ctx = self.model.project(features[None])                               # [1, C, H]
        cos, sin = self.model.rotary(positions)
        for i, layer in enumerate(self.model.layers):
            k, v = layer.context_kv(ctx, cos, sin)                             # [1, KV, C, hd]
            for c, rows in zip(contexts, row_slices(counts)):
                c.cache.write(i, k[0, :, rows], v[0, :, rows])
        for c, n in zip(contexts, counts):
            c.cache.commit(n)
            c.pending = []

    @torch.inference_mode()
    def propose(self, contexts: list[DraftContext], bonuses: list[int], depths: list[int]) -> list[torch.Tensor]:
        """Draft logits [depth_b, V'] per sequence for the positions after its bonus token.

        Each block starts at its context's length (the bonus's position); depths are >= 1."""
        self.absorb(contexts)
        counts, starts = [d + 1 for d in depths], [c.length for c in contexts]
        slices, total = row_slices(counts), sum(counts)
        # tokens [N], positions [N] and the rows after each bonus [N - B], in one upload
        packed = torch.tensor([t for bonus, d in zip(bonuses, depths) for t in [bonus] + [self.mask_id] * d]
                              + [p for s, n in zip(starts, counts) for p in range(s, s + n)]
                              + [r for s in slices for r in range(s.start + 1, s.stop)],
                              dtype=torch.long, device=self.device)
        tokens, positions, rows = packed.split([total, total, total - len(counts)])
        keys = torch.arange(max(s + n for s, n in zip(starts, counts)), device=self.device)  # slot = position
        # [sequence][layer]: its block's visibility over its context and block, or None
        masks = [self.model.masks(positions[own], keys[:s + n]) for own, s, n in zip(slices, starts, counts)]
        cos, sin = self.model.rotary(positions)
        x = self.target.embed(tokens).to(self.model.dtype)[None]               # [1, N, H]
        for i, layer in enumerate(self.model.layers):
            x = layer(x, cos, sin, self._attend(i, contexts, slices, [m[i] for m in masks]))
        logits = F.linear(self.model.norm(x[0])[rows], self.head).float()      # [N - B, V']
        return list(logits.split(depths))

    @staticmethod
    def _attend(i: int, contexts, slices: list[slice], masks) -> Attend:
        """Layer i's attention over packed block rows (q [1, heads, N, hd]): each sequence's
        rows see its own context and block only."""
        def attend(q, k, v):
            out = torch.empty_like(q)
            for rows, c, mask in zip(slices, contexts, masks):
                one = attend_after(cached_store(c.cache, i), mask)
                out[:, :, rows] = one(q[:, :, rows], k[:, :, rows], v[:, :, rows])
            return out
        return attend
