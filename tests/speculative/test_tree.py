"""Tree builder, flattening, ancestor-only mask, walk and KV compaction on hand-made cases."""

import math

import torch

from serving.models import KVCache
from serving.speculative.chain import ChainVerifier
from serving.speculative.ddtree import TreeVerifier
from serving.speculative.tree import Tree, chain_tree, heap_tree, visibility, walk

A, B, C, X, Y, Z = 10, 11, 12, 20, 21, 22
ROOT = 99


def surrogate(tree: Tree, logp_of: dict[tuple[int, int], float]) -> float:
    """Expected accepted drafts under the factorised draft: sum of path probabilities;
    logp_of[(depth, token)] = log q_depth(token)."""
    path_logp = [0.0] * len(tree)
    total = 0.0
    for i in range(1, len(tree)):
        path_logp[i] = path_logp[tree.parents[i]] + logp_of[(tree.depths[i], tree.tokens[i])]
        total += math.exp(path_logp[i])
    return total


def unit_tree(budget=4):
    # research notes 3.2: depth-1 A .6 B .25 C .15; depth-2 x .5 y .4 z .1; L = 2
    logp = [[math.log(p) for p in (0.6, 0.25, 0.15)], [math.log(p) for p in (0.5, 0.4, 0.1)]]
    return heap_tree(ROOT, logp, [[A, B, C], [X, Y, Z]], budget)


def test_heap_tree_matches_the_unit_vector():
    tree = unit_tree()
    assert tree.tokens == (ROOT, A, X, B, Y)
    assert tree.parents == (-1, 0, 1, 0, 1)
    assert tree.depths == (0, 1, 2, 1, 2)
    assert tree.children == ({A: 1, B: 3}, {X: 2, Y: 4}, {}, {}, {})
    logp = {(1, A): math.log(.6), (1, B): math.log(.25), (2, X): math.log(.5), (2, Y): math.log(.4)}
    assert math.isclose(surrogate(tree, logp), .6 + .3 + .25 + .24)


def test_heap_tree_pops_in_non_increasing_path_probability_and_parents_come_first():
    tree = unit_tree(budget=9)  # every prefix: 3 + 3 * 3 = 12 > 9
    assert len(tree) == 10
    logp = {(1, A): .6, (1, B): .25, (1, C): .15, (2, X): .5, (2, Y): .4, (2, Z): .1}
    probs = [1.0]
    for i in range(1, len(tree)):
        probs.append(probs[tree.parents[i]] * logp[(tree.depths[i], tree.tokens[i])])
        assert tree.parents[i] < i
    assert probs[1:] == sorted(probs[1:], reverse=True)


def test_heap_tree_stops_when_the_heap_empties():
    tree = heap_tree(ROOT, [[0.0]], [[7]], budget=5)  # one candidate in all
    assert tree.tokens == (ROOT, 7)


def test_positions_share_depth_and_start_at_the_root():
    assert unit_tree().positions(40) == [40, 41, 42, 41, 42]


def test_visibility_is_ancestors_and_self():
    mask = visibility(unit_tree())
    expected = torch.tensor([
        [1, 0, 0, 0, 0],
        [1, 1, 0, 0, 0],
        [1, 1, 1, 0, 0],
        [1, 0, 0, 1, 0],
        [1, 1, 0, 0, 1],
    ], dtype=torch.bool)
    assert torch.equal(mask, expected)


def test_chain_tree_is_causal():
    tree = chain_tree(ROOT, [1, 2, 3])
    assert tree.is_chain and tree.depths == (0, 1, 2, 3)
    assert torch.equal(visibility(tree), torch.ones(4, 4, dtype=torch.bool).tril())


def test_walk_follows_choices_and_returns_the_bonus():
    tree = unit_tree()
    # choices per row: root -> A, A -> Y, Y -> 5 (not a child): path root, A, Y; bonus 5
    choices = [A, Y, 0, 0, 5]
    assert walk(tree, choices) == ([0, 1, 4], 5)
    assert walk(tree, [C, 0, 0, 0, 0]) == ([0], C)  # no child matches: only the bonus
    assert walk(tree, [B, 0, 0, 8, 0]) == ([0, 3], 8)


def test_kv_compaction_keeps_the_accepted_rows_in_path_order():
    cache = KVCache(num_layers=1, num_kv_heads=1, head_dim=1, capacity=16)
    committed = 3
    cache.k[0, 0, :committed, 0] = torch.tensor([1., 2., 3.])
    cache.length = committed
    rows = torch.arange(100, 105, dtype=torch.float32).view(1, 5, 1)  # 5 tree rows
    cache.write(0, rows, rows)
    path, _ = walk(unit_tree(), [A, Y, 0, 0, 5])
    cache.keep(path)
    assert cache.length == committed + 3
    assert cache.k[0, 0, :cache.length, 0].tolist() == [1., 2., 3., 100., 101., 104.]
    assert cache.v[0, 0, committed:cache.length, 0].tolist() == [100., 101., 104.]


def test_verifiers_shape_draft_logits():
    logits = torch.log(torch.tensor([[.6, .25, .15, 0.], [.5, .4, .1, 0.]]) + 1e-9)
    chain = ChainVerifier(block_size=3).plan(ROOT, logits, budget_rows=10)
    assert chain.tokens == (ROOT, 0, 0)
    tree = TreeVerifier(budget=4).plan(ROOT, logits, budget_rows=10)
    assert tree.tokens == (ROOT, 0, 0, 1, 1) and tree.parents == (-1, 0, 1, 0, 1)
    assert len(TreeVerifier(budget=4).plan(ROOT, logits, budget_rows=3)) == 3  # KV room caps the tree
