"""Linear verification (DFlash): the block's best draft per depth as a one-child chain.

Verified causally in one target pass; the shared walk then accepts the longest prefix
that matches the target's choices, plus the bonus token.
"""

from __future__ import annotations

import torch

from .base import Needs
from .selector import Candidates
from .tree import Tree, chain_tree


class ChainVerifier:
    def __init__(self, block_size: int):
        # One verify pass holds the bonus plus block_size - 1 drafts.
        self.needs = Needs(tree_attention=False, draft_tokens=block_size)
        self.budget = None      # a chain has no node budget (/server_info speculative_ddtree_budget)

    def plan(self, bonus: int, draft_logits: torch.Tensor, budget_rows: int, vocab=None) -> Tree:
        """draft_logits [depth, V'] -> chain of the argmax draft tokens (a point-mass draft);
        a selector draft's Candidates -> its greedy pairwise walk."""
        if isinstance(draft_logits, Candidates):
            return chain_tree(bonus, draft_logits.chain(max(budget_rows - 1, 0)))
        drafts = draft_logits[: max(budget_rows - 1, 0)].argmax(-1)
        return chain_tree(bonus, (drafts if vocab is None else vocab[drafts]).tolist())
