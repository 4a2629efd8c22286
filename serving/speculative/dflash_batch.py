"""DFlash drafting for many sequences at once: one draft pass over every sequence's block.

Each sequence owns a `DraftContext`: its own draft KV cache (projected target features of its
committed tokens, slot = position) and the features not yet projected. `BatchDrafter.absorb`
projects the pending features of all sequences in one pass; `propose` runs every sequence's
block [bonus, MASK x depth_b] packed back to back ([N] = sum of depth_b + 1 rows) through the
draft layers: projections and MLP once over [N, H], attention per sequence over its own
context and block with the single-sequence mask (serving.speculative.draft_model.visible), so
blocks of different depths need no padding and never see each other.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from serving.models.kv_cache import KVCache

from .draft_model import visible
from .preflight import check_captured


class DraftContext:
    """One sequence's draft context: K/V of `length` committed positions plus pending features."""

    def __init__(self, cfg, rows: int, dtype, device):
        self.cache = KVCache(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, rows, dtype, device)
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

    def context(self, rows: int) -> DraftContext:
        return DraftContext(self.cfg, rows, self.model.dtype, self.device)

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
            begin = 0
            for c, n in zip(contexts, counts):
                c.cache.write(i, k[0, :, begin:begin + n], v[0, :, begin:begin + n])
                begin += n
        for c, n in zip(contexts, counts):
            c.cache.commit(n)
            c.pending = []

    @torch.inference_mode()
    def propose(self, contexts: list[DraftContext], bonuses: list[int], depths: list[int]) -> list[torch.Tensor]:
        """Draft logits [depth_b, V'] per sequence for the positions after its bonus token.

        Each block starts at its context's length (the bonus's position); depths are >= 1."""
        self.absorb(contexts)
        counts = [d + 1 for d in depths]
        starts = [c.length for c in contexts]
        block = [t for bonus, d in zip(bonuses, depths) for t in [bonus] + [self.mask_id] * d]
        tokens = torch.tensor(block, dtype=torch.long, device=self.device)     # [N]
        positions = torch.cat([torch.arange(s, s + n, device=self.device) for s, n in zip(starts, counts)])
        masks = [[visible(positions[b:b + n], torch.arange(s + n, device=self.device), layer.causal, layer.window)
                  for b, s, n in zip(_offsets(counts), starts, counts)] for layer in self.model.layers]
        cos, sin = self.model.rotary(positions)
        x = self.target.embed(tokens).to(self.model.dtype)                     # [N, H]
        for i, layer in enumerate(self.model.layers):
            x = self._layer(layer, i, x, cos, sin, contexts, counts, masks[i])
        rows = [r for b, n in zip(_offsets(counts), counts) for r in range(b + 1, b + n)]   # after each bonus
        logits = F.linear(self.model.norm(x)[rows], self.head).float()        # [N - B, V']
        return list(logits.split(depths))

    def _layer(self, layer, i: int, x, cos, sin, contexts, counts, masks) -> torch.Tensor:
        """One draft layer over packed block rows x [N, H]; attention per sequence."""
        attn = layer.self_attn
        h = layer.input_layernorm(x)[None]                                     # [1, N, H]
        q = layer._heads(h, attn.q_proj, attn.q_norm, cos, sin)                # [1, heads, N, hd]
        k, v = layer._heads(h, attn.k_proj, attn.k_norm, cos, sin), layer._heads(h, attn.v_proj, None)
        out = torch.empty_like(q)
        for b, c, n, mask in zip(_offsets(counts), contexts, counts, masks):
            rows = slice(b, b + n)
            keys, values = c.cache.write(i, k[0, :, rows], v[0, :, rows])    # context then block, uncommitted
            out[:, :, rows] = F.scaled_dot_product_attention(q[:, :, rows], keys[None], values[None],
                                                             attn_mask=mask, enable_gqa=True)
        x = x + attn.o_proj(out.transpose(1, 2).flatten(2))[0]
        h = layer.post_attention_layernorm(x)
        return x + layer.mlp.down_proj(F.silu(layer.mlp.gate_proj(h)) * layer.mlp.up_proj(h))


def _offsets(counts: list[int]) -> list[int]:
    out, total = [], 0
    for n in counts:
        out.append(total)
        total += n
    return out
