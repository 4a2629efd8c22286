"""Training and measuring a DFlash 2 draft's candidate selector (serving/speculative/selector.py).

The selector is trained as it runs: at block row d its predecessor is the token the target
picked for row d-1 (the anchor for row 0: what an accepted chain has there), its candidates
are the draft's top-k at row d with the label put in place of the k-th when the draft missed
it (else there is nothing to learn from that row), and the loss is the cross-entropy of the
label among the k candidates' pairwise scores. Measured the way it runs: a greedy walk, each
row's choice the next row's predecessor.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

IGNORE = -100


def selector_loss(model, hidden: torch.Tensor, logits: torch.Tensor, labels: torch.Tensor, picks: torch.Tensor,
                  bonuses: torch.Tensor, vocab: torch.Tensor, weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(sum of weighted cross-entropy, sum of weights). hidden [m, L, H], logits [m, L, V'],
    labels [m, L] draft-vocabulary rows (IGNORE: none), picks [m, L] the target's ids,
    bonuses [m] ids, weight [m, L] per-row loss weight (0 where labels is IGNORE)."""
    selector = model.candidate_selector
    k = min(selector.top_k, logits.shape[-1])
    columns = logits.detach().topk(k, -1).indices                             # [m, L, K] best first
    known = labels != IGNORE
    hit = (columns == labels[..., None]) & known[..., None]
    missed = known & ~hit.any(-1)
    columns[..., -1] = torch.where(missed, labels, columns[..., -1])          # the label among them
    target_index = torch.where(known, (columns == labels[..., None]).float().argmax(-1), IGNORE)
    unary = logits.gather(-1, columns)                                        # [m, L, K]
    tokens = vocab[columns]
    predecessor = torch.cat([bonuses[:, None], picks[:, :-1]], 1)             # [m, L] ids
    query = selector.predecessor_codebook(predecessor) * selector.hidden_projection(hidden)   # [m, L, r]
    scores = unary + (selector.successor_codebook(tokens) @ query[..., None])[..., 0]
    ce = F.cross_entropy(scores.flatten(0, 1), target_index.flatten(), ignore_index=IGNORE, reduction="none")
    return (ce.view_as(weight) * weight).sum(), weight.sum()


def selected_drafts(model, hidden: torch.Tensor, logits: torch.Tensor, bonuses: torch.Tensor,
                    vocab: torch.Tensor) -> torch.Tensor:
    """The greedy chain's ids [m, L] (what the runtime's chain verifier proposes)."""
    return model.candidate_selector.select(hidden, logits, bonuses, vocab)[0]
