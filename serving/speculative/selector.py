"""DFlash 2's candidate selector: the draft's top-k per position, re-scored pairwise.

Layout as z-lab's `dflash` 0.1.0 saves it (CandidateSelector): `predecessor_codebook` and
`successor_codebook` Embedding(vocab, rank), `hidden_projection` Linear(H -> rank, no bias),
and `selector_top_k` = K. For a block's rows after the bonus (hidden h [L, H], logits [L, V]):
the K best columns per row (unary scores u [L, K], tokens c [L, K]), and candidate j at row d,
given the token p chosen before it (the bonus at row 0), scores

    s_d(j | p) = u[d, j] + < predecessor(p) * hidden_projection(h_d), successor(c[d, j]) >.

A chain walks the rows in order: greedy takes argmax s, sampling draws from softmax(s / T);
the chosen token is the next row's predecessor. `Candidates` keeps one block's scores so the
chain verifier can walk them and the tree verifier can grow a tree whose children are scored
given their parent's token (`pairwise_tree`). Lossless either way: the target verifies every
proposed token, the selector only decides which ones are proposed.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import torch
from torch import nn

from .tree import Tree, _assemble

# Stored without `.weight` in some releases (the package's from_pretrained maps them back).
BARE_NAMES = ("candidate_selector.predecessor_codebook", "candidate_selector.successor_codebook")


class CandidateSelector(nn.Module):
    def __init__(self, vocab: int, hidden: int, rank: int, top_k: int):
        super().__init__()
        self.top_k = top_k
        self.predecessor_codebook = nn.Embedding(vocab, rank)
        self.successor_codebook = nn.Embedding(vocab, rank)
        self.hidden_projection = nn.Linear(hidden, rank, bias=False)

    def candidates(self, hidden: torch.Tensor, logits: torch.Tensor, bonus: torch.Tensor,
                   vocab: torch.Tensor | None = None) -> Candidates:
        """One block: hidden [L, H], logits [L, V'] (columns: `vocab` ids, None = all), bonus
        [] or [1] long -> its Candidates. L >= 1."""
        unary, columns = logits.float().topk(min(self.top_k, logits.shape[-1]), -1, sorted=False)  # [L, K]
        tokens = columns if vocab is None else vocab[columns]
        context = self.hidden_projection(hidden).float()                       # [L, r]
        successor = self.successor_codebook(tokens).float()                   # [L, K, r]
        # row d's predecessors are row d-1's candidates (the bonus for row 0): [L-1, K, K]
        before = self.predecessor_codebook(tokens[:-1]).float() * context[1:, None, :]
        pairs = unary[1:, None, :] + before @ successor[1:].transpose(-1, -2)
        first = unary[0] + successor[0] @ (self.predecessor_codebook(bonus.view(-1)).float()[0] * context[0])
        return Candidates(tokens, first, pairs, logits)

    def shortlist(self, hidden: torch.Tensor, logits: torch.Tensor, vocab: torch.Tensor | None = None):
        """Blocks [b, L, ..]: (unary [b, L, K], candidate ids [b, L, K], hidden_projection(h) [b, L, r])."""
        unary, columns = logits.topk(min(self.top_k, logits.shape[-1]), -1, sorted=False)
        return unary, columns if vocab is None else vocab[columns], self.hidden_projection(hidden)

    def scores(self, unary, tokens, context, predecessor: torch.Tensor) -> torch.Tensor:
        """Row scores given each block's predecessor: unary, tokens [b, K], context [b, r],
        predecessor [b] ids -> s(. | predecessor) [b, K]."""
        query = self.predecessor_codebook(predecessor) * context                # [b, r]
        return unary + (self.successor_codebook(tokens) @ query[:, :, None])[..., 0]

    def select(self, hidden: torch.Tensor, logits: torch.Tensor, bonuses: torch.Tensor,
               vocab: torch.Tensor | None = None, temperature: float = 0.0, generator=None):
        """b blocks walked row by row: hidden [b, L, H], logits [b, L, V'], bonuses [b] ->
        (chosen ids [b, L], candidate ids [b, L, K], for T > 0 each row's q [b, L, K] else None)."""
        unary, tokens, context = self.shortlist(hidden, logits, vocab)
        predecessor, path, q_rows = bonuses, [], []
        for d in range(tokens.shape[1]):
            s = self.scores(unary[:, d], tokens[:, d], context[:, d], predecessor)
            if temperature > 0:
                q = torch.softmax(s.float() / temperature, -1)
                index = torch.multinomial(q, 1, generator=generator)[:, 0]
                q_rows.append(q)
            else:
                index = s.argmax(-1)
            predecessor = tokens[:, d].gather(-1, index[:, None])[:, 0]
            path.append(predecessor)
        return torch.stack(path, 1), tokens, torch.stack(q_rows, 1) if q_rows else None


@dataclass(frozen=True)
class Candidates:
    """One block's selector scores. tokens [L, K] ids; first [K] = s_0(j | bonus);
    pairs [L-1, K, K]: pairs[d-1, i, j] = s_d(j | tokens[d-1, i]); logits [L, V']: the
    draft's own (the marginals a tree without the selector would use)."""

    tokens: torch.Tensor
    first: torch.Tensor
    pairs: torch.Tensor
    logits: torch.Tensor

    def __len__(self) -> int:
        return self.tokens.shape[0]

    def walk(self, depth: int, temperature: float = 0.0, generator: torch.Generator | None = None):
        """The chain of `depth` rows: (token ids [depth], candidate index per row [depth], and for
        T > 0 the distribution each row was drawn from [depth, K]). Stays on the device."""
        picks, q_rows, scores = [], [], self.first
        for d in range(min(depth, len(self))):
            if d:
                scores = self.pairs[d - 1][picks[-1]]     # s_d(. | the previous pick)
            if temperature > 0:
                q = torch.softmax(scores / temperature, -1)
                pick = torch.multinomial(q, 1, generator=generator)[0]
                q_rows.append(q)
            else:
                pick = scores.argmax(-1)
            picks.append(pick)
        index = torch.stack(picks) if picks else self.tokens.new_zeros(0)
        chosen = self.tokens[torch.arange(index.numel(), device=index.device), index]
        return chosen, index, torch.stack(q_rows) if q_rows else None

    def chain(self, depth: int) -> list[int]:
        """The greedy chain's token ids (what the chain verifier proposes)."""
        return self.walk(depth)[0].tolist()

    def tree(self, root: int, budget: int) -> Tree:
        """The `budget` most probable prefixes when row d's candidates share the probability the
        draft's marginal gives them, P_K(d), in the proportions softmax(s_d(. | its parent's
        token)) sets: log q(j | p) = log P_K(d) + log_softmax_K(s_d(. | p))(j). A selector that
        carries no information (s_d = the draft's logits) so gives the marginal tree, node for
        node; normalized within the K candidates alone, every row would hold probability 1 and
        the tree would go deep where the draft is unsure (DDTree:16 read 1.33 tokens a round
        where the marginal tree reads 1.41)."""
        depth = min(len(self), budget)
        logits = self.logits[:depth].float()                                        # [depth, V']
        kept = logits.topk(self.tokens.shape[-1], -1).values                        # the K candidates' logits
        mass = torch.logsumexp(kept, -1) - torch.logsumexp(logits, -1)               # log P_K(d) [depth]
        first = torch.log_softmax(self.first.float(), -1) + mass[0]
        pairs = torch.log_softmax(self.pairs[: depth - 1].float(), -1) + mass[1:, None, None]
        return pairwise_tree(root, first.tolist(), pairs.tolist(), self.tokens[:depth].tolist(), budget)


def pairwise_tree(root: int, first: list[float], pairs: list, tokens: list[list[int]], budget: int) -> Tree:
    """Best-first over prefixes, score = sum of log q(child | parent). first[j]: log q of row-0
    candidate j; pairs[d-1][i][j]: log q of row-d candidate j under row-(d-1) candidate i;
    tokens[d][j]. Popping a node pushes its next-best sibling and its best child, so the heap
    holds at most 2 * budget entries; ties break on push order."""
    nodes: list[tuple[int, int, int]] = []
    if not tokens or budget <= 0:
        return _assemble(root, nodes)
    orders = {}                                    # (depth, parent candidate) -> children best first

    def order(d: int, parent: int) -> list[int]:
        if (d, parent) not in orders:
            row = first if d == 0 else pairs[d - 1][parent]
            orders[d, parent] = sorted(range(len(row)), key=lambda j: -row[j])
        return orders[d, parent]

    def logq(d: int, parent: int, j: int) -> float:
        return first[j] if d == 0 else pairs[d - 1][parent][j]

    count = 0
    # (-path score, push count, parent row, parent candidate, depth index, rank among siblings)
    heap = [(-logq(0, -1, order(0, -1)[0]), count, 0, -1, 0, 0)]
    while heap and len(nodes) < budget:
        neg, _, parent_row, parent, d, rank = heapq.heappop(heap)
        j = order(d, parent)[rank]
        nodes.append((tokens[d][j], parent_row, d + 1))
        row = len(nodes)
        siblings = order(d, parent)
        if rank + 1 < len(siblings):
            count += 1
            score = -neg - logq(d, parent, j) + logq(d, parent, siblings[rank + 1])
            heapq.heappush(heap, (-score, count, parent_row, parent, d, rank + 1))
        if d + 1 < len(tokens):
            count += 1
            heapq.heappush(heap, (neg - logq(d + 1, j, order(d + 1, j)[0]), count, row, j, d + 1, 0))
    return _assemble(root, nodes)
