"""The selector's chain and pairwise tree on hand-made scores (pure, milliseconds)."""

from __future__ import annotations

import torch

from serving.speculative.selector import Candidates, pairwise_tree
from serving.speculative.tree import heap_tree

TOKENS = torch.tensor([[10, 11, 12], [20, 21, 22], [30, 31, 32]])  # [L=3, K=3] candidate ids


def test_scores_that_ignore_the_parent_give_the_marginal_tree():
    """When s_d(j | i) is the same for every parent i, the pairwise tree is the heap tree over
    those per-row distributions, node for node."""
    g = torch.Generator().manual_seed(0)
    rows = torch.log_softmax(torch.randn(3, 3, generator=g), -1)            # [L, K]
    pairs = rows[1:, None, :].expand(2, 3, 3)
    for budget in (1, 4, 9):
        ours = pairwise_tree(0, rows[0].tolist(), pairs.tolist(), TOKENS.tolist(), budget)
        order = rows.sort(-1, descending=True)
        marginal = heap_tree(0, order.values.tolist(), TOKENS.gather(1, order.indices).tolist(), budget)
        assert (ours.tokens, ours.parents, ours.depths) == (marginal.tokens, marginal.parents, marginal.depths)


def test_a_child_is_scored_given_its_parent_token():
    """Row 1 prefers 21 after 10 but 22 after 11: each parent's best child differs."""
    first = torch.tensor([0.0, -0.1, -9.0])
    pairs = torch.full((2, 3, 3), -9.0)
    pairs[0, 0, 1] = pairs[0, 1, 2] = 0.0          # 10 -> 21, 11 -> 22
    pairs[1, :, 0] = 0.0                           # anything -> 30
    c = Candidates(TOKENS, first, pairs, torch.zeros(3, 8))
    assert c.chain(3) == [10, 21, 30]
    tree = c.tree(root=5, budget=6)
    children = {tree.tokens[r]: {tree.tokens[k] for k in tree.children[r].values()} for r in range(len(tree))}
    assert children[10] == {21} and children[11] == {22}
    assert len(tree) == 7 and all(p < i for i, p in enumerate(tree.parents) if i)


def test_sampled_walk_draws_from_each_rows_softmax():
    first = torch.tensor([0.0, 0.0, -50.0])
    pairs = torch.zeros(2, 3, 3)
    c = Candidates(TOKENS, first, pairs, torch.zeros(3, 8))
    drawn = {tuple(c.walk(1, 1.0, torch.Generator().manual_seed(s))[0].tolist()) for s in range(40)}
    assert drawn == {(10,), (11,)}                 # 12 has probability e^-50
    _, _, q = c.walk(3, 1.0, torch.Generator().manual_seed(0))
    torch.testing.assert_close(q[0], torch.softmax(first, -1))


def test_a_selector_that_knows_nothing_plans_the_marginal_tree():
    """A selector whose pairwise term is zero (codebooks of zeros: a DFlash 1 draft extended to
    DFlash 2) scores each candidate by the draft's own logit, and its tree is the DDTree
    verifier's marginal tree, node for node, whatever the top-K mass of each row."""
    from serving.speculative.ddtree import TreeVerifier
    from serving.speculative.selector import CandidateSelector

    for seed in range(8):           # rows of random sharpness: each row's top-K mass differs
        g = torch.Generator().manual_seed(seed)
        logits = torch.randn(6, 40, generator=g) * (torch.rand(6, 1, generator=g) * 4)      # [L, V]
        selector = CandidateSelector(vocab=40, hidden=8, rank=4, top_k=8)
        torch.nn.init.zeros_(selector.predecessor_codebook.weight)
        torch.nn.init.zeros_(selector.successor_codebook.weight)
        candidates = selector.candidates(torch.randn(6, 8, generator=g), logits, torch.tensor([1]))
        for budget in (1, 3, 8):    # at most K nodes: no marginal node ranks below the K candidates
            ours = candidates.tree(root=1, budget=budget)
            marginal = TreeVerifier(budget).plan(1, logits, budget + 1)
            assert (ours.tokens, ours.parents, ours.depths) == (marginal.tokens, marginal.parents, marginal.depths)
