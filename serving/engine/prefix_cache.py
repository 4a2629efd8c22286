"""PrefixCache: K/V (and drafter features) of prompt blocks earlier requests already computed.

Requests often share a prompt prefix: the chat template's system prompt (24 tokens of every
SmolLM2 chat), few-shot examples. The full BLOCK-token blocks of every prefilled prompt are
kept in a bounded LRU, each keyed by a hash chained over the blocks before it (a block is
only ever reused after the same tokens from position 0; its tokens and parent are compared on
a hit). A new prompt's longest cached run of blocks is copied into its own pool rows instead
of being computed, leaving at least its last token to compute (that row's logits give the
first token). The K/V of a position depend only on the tokens up to it, so a copied block
holds what the prefill would compute, up to the rounding of a different packing of rows.

Storage is preallocated at start, outside the KV pool, for `max_blocks` blocks
(serving.contract.runtime.prefix_rows: 128 x 8 rows; Qwen3-8B bf16: 144 KiB of K/V a row,
144 MiB in all): each block owns a slot of BLOCK rows, and the least recently used block's
slot is reused when all are taken, so serving.memory measures what it predicts at start and
after any traffic.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import torch

from serving.contract.runtime import PREFIX_BLOCK, PREFIX_BLOCKS
from serving.models.kv_cache import KVCache

BLOCK = PREFIX_BLOCK


@dataclass
class Block:
    parent: int | None                   # key of the block before it (None: the prompt's first)
    tokens: tuple[int, ...]
    slot: int                            # its rows of the store: [slot * BLOCK, (slot + 1) * BLOCK)


class PrefixCache:
    def __init__(self, layers: int, kv_heads: int, head_dim: int, kv_dtype: torch.dtype, dtype: torch.dtype,
                 device, feature_width: int = 0, max_blocks: int = PREFIX_BLOCKS):
        rows = max_blocks * BLOCK
        # k, v: [layers, kv_heads, rows, head_dim] as the pool's (kv_dtype); features [rows,
        # feature_width] in the dtype the target computes in
        self.k = torch.empty(layers, kv_heads, rows, head_dim, dtype=kv_dtype, device=device)
        self.v = torch.empty_like(self.k)
        self.features = torch.empty(rows, feature_width, dtype=dtype, device=device) if feature_width else None
        self.max_blocks = max_blocks
        self.blocks: OrderedDict[int, Block] = OrderedDict()
        self.free = list(range(max_blocks - 1, -1, -1))    # unused slots, popped lowest first
        self.prompt_tokens = self.cached_tokens = 0        # counted once per prompt, for the hit rate

    @classmethod
    def for_model(cls, config, kv_dtype: torch.dtype, dtype: torch.dtype, device, feature_width: int = 0,
                  max_blocks: int = PREFIX_BLOCKS) -> "PrefixCache":
        return cls(*KVCache.dims(config), kv_dtype, dtype, device, feature_width, max_blocks)

    def store_bytes(self) -> int:
        """Bytes of the preallocated store (serving.memory's prefix_cache_bytes)."""
        tensors = [self.k, self.v] + ([self.features] if self.features is not None else [])
        return sum(t.numel() * t.element_size() for t in tensors)

    @property
    def hit_rate(self) -> float:
        """Share of prompt tokens copied from the cache instead of computed."""
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    def lookup(self, prompt: list[int]) -> list[Block]:
        """The longest run of cached blocks the prompt starts with, its last token left out.
        Valid until the next `store` (which may reuse their slots)."""
        out, parent = [], None
        for i in range((len(prompt) - 1) // BLOCK):
            tokens = tuple(prompt[i * BLOCK:(i + 1) * BLOCK])
            key = hash((parent, tokens))
            block = self.blocks.get(key)
            if block is None or block.tokens != tokens or block.parent != parent:
                break
            self.blocks.move_to_end(key)
            out.append(block)
            parent = key
        self.prompt_tokens += len(prompt)
        self.cached_tokens += len(out) * BLOCK
        return out

    def store(self, prompt: list[int], cache, features: torch.Tensor | None) -> None:
        """Keep the prompt's full blocks (its K/V in cache rows [0, len(prompt)), features [len, F])."""
        parent = None
        for i in range(len(prompt) // BLOCK):
            rows = slice(i * BLOCK, (i + 1) * BLOCK)
            tokens = tuple(prompt[rows])
            key = hash((parent, tokens))
            if key in self.blocks:
                self.blocks.move_to_end(key)
            else:
                slot = self.free.pop() if self.free else self.blocks.popitem(last=False)[1].slot
                own = slice(slot * BLOCK, (slot + 1) * BLOCK)
                self.k[:, :, own] = cache.k[:, :, rows]
                self.v[:, :, own] = cache.v[:, :, rows]
                if self.features is not None and features is not None:
                    self.features[own] = features[rows]
                self.blocks[key] = Block(parent, tokens, slot)
            parent = key

    def copy(self, blocks: list[Block], cache) -> torch.Tensor | None:
        """Write the blocks into the cache's first rows and commit them; their features [n, F] or None."""
        n = len(blocks) * BLOCK
        rows = torch.tensor([b.slot * BLOCK + r for b in blocks for r in range(BLOCK)], device=self.k.device)
        cache.k[:, :, :n] = self.k[:, :, rows]
        cache.v[:, :, :n] = self.v[:, :, rows]
        cache.commit(n)
        return None if self.features is None else self.features[rows]
