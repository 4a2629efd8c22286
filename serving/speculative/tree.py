"""Draft trees: the heap builder, flattening, the ancestor-only mask and the walk.

Pure: lists in, lists out, except the masks (torch, built per depth level on the device).
Row 0 of every tree is the root, the bonus token the target chose last round; rows
1..n are nodes in heap-pop order, so a parent's row is always before its children's.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Sequence


@dataclass(frozen=True)
class Tree:
    tokens: tuple[int, ...]  # [n+1] token per row; row 0 = root (bonus)
    parents: tuple[int, ...]  # [n+1] parent row; -1 for the root
    depths: tuple[int, ...]  # [n+1] root depth 0
    children: tuple[dict[int, int], ...]  # [n+1] token -> child row

    def __len__(self) -> int:
        return len(self.tokens)

    def positions(self, start: int) -> list[int]:
        """Absolute positions: siblings share one, the root sits at `start`."""
        return [start + d for d in self.depths]

    @property
    def is_chain(self) -> bool:
        return all(p == i - 1 for i, p in enumerate(self.parents))

    def prefix(self, rows: int) -> Tree:
        """The first `rows` rows (root included). Rows are in heap-pop (or chain) order, so this
        is the tree a smaller budget (or block) builds from the same draft, and a parent's row
        always precedes its children's."""
        if rows >= len(self):
            return self
        return _assemble(self.tokens[0], [(self.tokens[i], self.parents[i], self.depths[i])
                                          for i in range(1, max(rows, 1))])


def _assemble(root: int, nodes: Sequence[tuple[int, int, int]]) -> Tree:
    """nodes: (token, parent row, depth) in row order 1..n."""
    tokens, parents, depths = [root], [-1], [0]
    children: list[dict[int, int]] = [{}]
    for row, (token, parent, depth) in enumerate(nodes, start=1):
        tokens.append(token)
        parents.append(parent)
        depths.append(depth)
        children.append({})
        children[parent][token] = row
    return Tree(tuple(tokens), tuple(parents), tuple(depths), tuple(children))


def chain_tree(root: int, drafts: Sequence[int]) -> Tree:
    """The linear block [root, d1, .., dL] as a tree with one child per node."""
    return _assemble(root, [(t, i, i + 1) for i, t in enumerate(drafts)])


def heap_tree(root: int, top_logp: Sequence[Sequence[float]], top_tok: Sequence[Sequence[int]], budget: int) -> Tree:
    """The `budget` most probable prefixes under per-depth independent draft marginals.

    top_logp[d-1][r], top_tok[d-1][r]: rank-r log-prob and token at depth d (rank 0 best,
    non-increasing). Best-first: popping a node pushes its next sibling and its first
    child, so at most 2*budget pushes. Ties break on the smaller rank tuple.
    """
    depth_limit, width = len(top_logp), len(top_logp[0]) if top_logp else 0
    nodes: list[tuple[int, int, int]] = []
    if depth_limit == 0 or width == 0 or budget <= 0:
        return _assemble(root, nodes)
    # Entries: (-score, ranks, parent row, depth, rank); heapq is a min-heap.
    heap = [(-top_logp[0][0], (0,), 0, 1, 0)]
    while heap and len(nodes) < budget:
        neg, ranks, parent, depth, rank = heapq.heappop(heap)
        nodes.append((top_tok[depth - 1][rank], parent, depth))
        row = len(nodes)
        if rank + 1 < width:
            score = -neg - top_logp[depth - 1][rank] + top_logp[depth - 1][rank + 1]
            heapq.heappush(heap, (-score, ranks[:-1] + (rank + 1,), parent, depth, rank + 1))
        if depth < depth_limit:
            heapq.heappush(heap, (neg - top_logp[depth][0], ranks + (0,), row, depth + 1, 0))
    return _assemble(root, nodes)


def ancestors(parents, max_depth: int):
    """parents [n] long (root -1) -> A [n, max_depth + 1]: A[r, k] = k-th ancestor of row r,
    saturating at the root. One gather per depth level, none per node (runs on the device)."""
    import torch

    up = parents.clamp(min=0)  # the root is its own parent: the walk up stops there
    levels = [torch.arange(parents.numel(), device=parents.device)]
    for _ in range(max_depth):
        levels.append(up[levels[-1]])
    return torch.stack(levels, 1)


def visibility(tree: Tree, device=None):
    """Ancestor-only mask V [n+1, n+1] bool: row i sees its ancestors and itself."""
    import torch

    table = ancestors(torch.tensor(tree.parents, device=device), max(tree.depths))
    n = len(tree)
    return torch.zeros(n, n, dtype=torch.bool, device=table.device).scatter_(1, table, True)


def walk(tree: Tree, choices: Sequence[int]) -> tuple[list[int], int]:
    """Follow the target's choice per row while it names a child.

    Returns the accepted path (rows, root first) and the bonus: the target's choice
    after the last accepted row. Lossless under sampling when each choice is an
    independent target sample for its row.
    """
    row, path = 0, [0]
    token = choices[0]
    while token in tree.children[row]:
        row = tree.children[row][token]
        path.append(row)
        token = choices[row]
    return path, token


class Trial:
    """A drafted tree standing in for one round of each of several verify widths, followed along
    the tokens the sequence then commits, whatever was verified.

    A width of r rows would have verified the tree's first r rows (`Tree.prefix`): its round
    accepts the walk's rows below r and ends at the first committed token that leaves them (no
    child, or a child at row >= r), its bonus. So each width's round ends at the position where
    that width's next round would draft. A trial drafted there continues the width's chain: its
    round starts where a fixed run of that width would start one, right after that width's last
    bonus or at the sequence's first decoder round, and only such rounds count (`chained`); one
    drafted elsewhere (a measuring window's first round, after the verified rounds skipped the
    position, or where another width's round merely ended there) starts a chain and is not counted,
    because where a round starts is not independent of what it accepts (inside a run the draft
    just predicted, it accepts more). So a width's counted trials are exactly the rounds a fixed
    run of it makes (serving.speculative.lane). At T=0 the committed tokens are the target's
    argmax; with positional draws they are the samples a verify pass would draw, so each width's
    walk is exactly the one its verify would take."""

    def __init__(self, tree: Tree, widths: Sequence[int], owner=None, chained: Sequence[int] = (),
                 weight: float = 1.0):
        # weight: what its widest round counts for in the server's figure (0: drafted outside
        # a measuring window; serving.speculative.adaptive.Controller._measure)
        self.tree, self.owner, self.weight = tree, owner, weight
        self.open = sorted(widths)                  # widths (verify rows) whose round has not ended
        self.chained = frozenset(chained)           # of those, the ones whose chain it continues
        self.row, self.path = 0, []                 # path: accepted rows, root excluded (ascending)

    @property
    def done(self) -> bool:
        return not self.open

    def feed(self, tokens: Sequence[int]) -> list[tuple[int, int, bool]]:
        """The sequence's next committed tokens -> the widths whose round they ended, each
        (rows, drafts accepted, whether its bonus is the last of `tokens`, so the next round
        starts where that width's next round would); a width ends at its bonus, the first token
        it could not verify."""
        ended, children = [], self.tree.children
        for i, token in enumerate(tokens):
            child = children[self.row].get(token)
            rows = child if child is not None else float("inf")    # no child: every width ends
            while self.open and self.open[0] <= rows:
                ended.append((self.open.pop(0), len(self.path), i == len(tokens) - 1))
            if not self.open:
                break
            self.row = child
            self.path.append(child)
        return ended

    def accepted(self, rows: int) -> int:
        """Drafts a tree of the first `rows` rows would have accepted so far (path rows ascend)."""
        return sum(r < rows for r in self.path)
