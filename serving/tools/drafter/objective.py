"""What the draft is trained on and measured by, over its reduced vocabulary.

A block at anchor s of an `Answer`: ids [tok_s, MASK x (B-1)] at positions s..s+B-1, context =
target features of positions < s; row k (1..B-1) proposes the token at s+k, and its label is
the target's greedy pick after position s+k-1. Anchors lie in the response (s >= prompt_len):
a round's bonus token is always a generated one. The LM head is the target's rows for the
draft vocabulary (as `DFlashDrafter` runs it), so labels outside it are ignored.

`accepted_lengths` is one DFlash round at each anchor, simulated: leading drafts (argmaxes, or a
DFlash 2 selector's greedy chain) equal to the target's picks, plus the bonus. On a greedy answer this is exactly what a chain verify
accepts there (an accepted draft is the greedy token, so the next pick's context is the same).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from serving.tools.train_draft import block_hidden, depth_weights

from .selection import selected_drafts, selector_loss

IGNORE = -100


def vocab_index(vocab: torch.Tensor, size: int) -> torch.Tensor:
    """[size] long: each token id's row in the draft vocabulary `vocab` [V'], IGNORE outside it."""
    index = torch.full((size,), IGNORE, dtype=torch.long)
    index[vocab] = torch.arange(vocab.numel())
    return index


def block_targets(answer, anchors: torch.Tensor, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Target picks [m, B-1] for the rows of blocks at `anchors` [m], and which exist [m, B-1]
    (a block running past the answer's end has no label there)."""
    pos = anchors[:, None] + torch.arange(block - 1)  # pick after position s+k-1 names the token at s+k
    inside = pos < answer.picks.numel()
    return answer.picks[pos.clamp(max=answer.picks.numel() - 1)], inside


def draft_rows(model, target, head: torch.Tensor, answer, anchors: torch.Tensor):
    """(final hidden [m, B-1, H], logits [m, B-1, V'] over the draft vocabulary; head [V', H]:
    the target's rows), as the drafter computes them."""
    hidden = block_hidden(model, target, answer.tokens, answer.feats.float(), anchors)
    return hidden, model.logits(hidden, head)


def block_loss(model, target, head: torch.Tensor, index: torch.Tensor, answer,
               anchors: torch.Tensor, vocab: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(sum of depth-weighted cross-entropy, sum of weights) over blocks at `anchors` [m]; a
    draft with a candidate selector adds its loss (selection.py) at the same weights."""
    block = model.cfg.block_size
    picks, inside = block_targets(answer, anchors, block)
    labels = torch.where(inside, index[picks], IGNORE)  # [m, B-1] rows of the draft vocabulary
    hidden, logits = draft_rows(model, target, head, answer, anchors)
    ce = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=IGNORE, reduction="none")
    weight = depth_weights(block) * (labels != IGNORE)
    total = (ce.view_as(weight) * weight).sum()
    if model.candidate_selector is not None:
        total = total + selector_loss(model, hidden, logits, labels, picks, answer.tokens[anchors], vocab, weight)[0]
    return total, weight.sum()


@torch.no_grad()
def accepted_lengths(model, target, head: torch.Tensor, vocab: torch.Tensor, answer,
                     anchors: torch.Tensor, chunk: int = 64) -> torch.Tensor:
    """Tokens one DFlash round at each anchor [m] commits (accepted drafts + bonus) -> [m] long."""
    block, out = model.cfg.block_size, []
    for part in anchors.split(chunk):
        hidden, logits = draft_rows(model, target, head, answer, part)
        drafts = (vocab[logits.argmax(-1)] if model.candidate_selector is None        # [m, B-1] ids
                  else selected_drafts(model, hidden, logits, answer.tokens[part], vocab))
        picks, inside = block_targets(answer, part, block)
        match = (drafts == picks) & inside
        out.append(match.long().cumprod(-1).sum(-1) + 1)
    return torch.cat(out)


def response_anchors(answer, stride: int = 1) -> torch.Tensor:
    """Anchors over the response: positions prompt_len .. S-1 (every `stride`-th)."""
    return torch.arange(answer.prompt_len, answer.tokens.numel(), stride)


def held_out_tau(model, target, head, vocab, answers, stride: int = 1) -> float:
    """Mean accepted length of a DFlash round over the held-out answers' response positions."""
    was_training = model.training
    model.eval()
    lengths = torch.cat([accepted_lengths(model, target, head, vocab, a, response_anchors(a, stride))
                         for a in answers])
    model.train(was_training)
    return float(lengths.float().mean())
