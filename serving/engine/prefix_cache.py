"""PrefixCache: K/V (and drafter features) of prompt blocks earlier requests already computed.

Requests often share a prompt prefix: the chat template's system prompt (24 tokens of every
SmolLM2 chat), few-shot examples. The full BLOCK-token blocks of every prefilled prompt are
kept in a bounded LRU, each keyed by a hash chained over the blocks before it (a block is
only ever reused after the same tokens from position 0; its tokens and parent are compared on
a hit). A new prompt's longest cached run of blocks is copied into its own pool rows instead
of being computed, leaving at least its last token to compute (that row's logits give the
first token). The K/V of a position depend only on the tokens up to it, so a copied block
holds what the prefill would compute, up to the rounding of a different packing of rows.
The copies live outside the KV pool (at most `max_blocks` blocks; SmolLM2 fp32: 46 KB a row).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import torch

BLOCK = 8


@dataclass
class Block:
    parent: int | None                   # key of the block before it (None: the prompt's first)
    tokens: tuple[int, ...]
    k: torch.Tensor                      # [layers, kv_heads, BLOCK, head_dim]
    v: torch.Tensor
    features: torch.Tensor | None        # [BLOCK, feature_width]: the drafter's target features


class PrefixCache:
    def __init__(self, max_blocks: int = 128):
        self.max_blocks = max_blocks
        self.blocks: OrderedDict[int, Block] = OrderedDict()
        self.prompt_tokens = self.cached_tokens = 0        # counted once per prompt, for the hit rate

    @property
    def hit_rate(self) -> float:
        """Share of prompt tokens copied from the cache instead of computed."""
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    def lookup(self, prompt: list[int]) -> list[Block]:
        """The longest run of cached blocks the prompt starts with, its last token left out."""
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
                self.blocks[key] = Block(parent, tokens, cache.k[:, :, rows].clone(), cache.v[:, :, rows].clone(),
                                         None if features is None else features[rows].clone())
                if len(self.blocks) > self.max_blocks:
                    self.blocks.popitem(last=False)
            parent = key

    @staticmethod
    def copy(blocks: list[Block], cache) -> torch.Tensor | None:
        """Write the blocks into the cache's first rows and commit them; their features [n, F] or None."""
        n = len(blocks) * BLOCK
        cache.k[:, :, :n] = torch.cat([b.k for b in blocks], dim=2)
        cache.v[:, :, :n] = torch.cat([b.v for b in blocks], dim=2)
        cache.commit(n)
        return None if blocks[0].features is None else torch.cat([b.features for b in blocks])
