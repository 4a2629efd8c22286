"""Tree verification (DDTree): the `budget` most probable draft prefixes, verified at once."""

from __future__ import annotations

import torch

from .base import Needs
from .selector import Candidates
from .tree import Tree, heap_tree


class TreeVerifier:
    def __init__(self, budget: int):
        self.budget = budget
        # Root (bonus) plus `budget` nodes share one verify pass under an ancestor-only mask.
        self.needs = Needs(tree_attention=True, draft_tokens=budget + 1)

    def plan(self, bonus: int, draft_logits: torch.Tensor, budget_rows: int, vocab=None) -> Tree:
        """draft_logits [depth, V']: per-depth marginals q_d, independent of earlier picks;
        vocab [V'] maps columns to token ids (a reduced draft vocabulary), None: identity."""
        budget = min(self.budget, budget_rows - 1)
        if budget <= 0 or len(draft_logits) == 0:
            return heap_tree(bonus, [], [], 0)
        if isinstance(draft_logits, Candidates):  # a selector draft: children scored given their parent
            return draft_logits.tree(bonus, budget)
        width = min(budget, draft_logits.shape[-1])
        logits = draft_logits[:budget].float()  # a tree of `budget` nodes is at most that deep
        top = logits.topk(width, -1)  # [depth, width]; log-probs are logits minus logsumexp
        logp = top.values - torch.logsumexp(logits, -1, keepdim=True)
        tokens = top.indices if vocab is None else vocab[top.indices]
        return heap_tree(bonus, logp.tolist(), tokens.tolist(), budget)
