"""One forward through a target model for many sequences at once: ragged rows, one call.

The rows of all sequences are packed back to back ([N] = sum of each sequence's T_b rows:
one decode token, a prefill chunk, or a speculative tree); every caller, one sequence or many,
plain or speculative, takes these two. Each is the model's own: a dense decoder
(serving.models.llama) runs the batch in one pass (`CausalLM.forward_packed`, its only
forward); a hybrid (serving.models.qwen3_5) runs a plain decode step of the batch in one step
(serving.models.hybrid_batched) and any other rows one sequence at a time, each through its
own forward (so a speculative hybrid runs one sequence at a time:
serving.contract.runtime.one_at_a_time).
"""

from __future__ import annotations

import torch

from serving.models.llama import CausalLM
from serving.models.qwen3_5 import HybridLM


def supports(model) -> bool:
    """The model runs many sequences' rows in one pass (dense decoders; hybrids take them in turn)."""
    return isinstance(model, CausalLM)


def decodes(model) -> bool:
    """A batched plain decode step exists for this target (every `supports` model, and hybrids)."""
    return supports(model) or isinstance(model, HybridLM)


def decode_step(model, tokens: torch.Tensor, positions: torch.Tensor, caches: list,
                capture: tuple[int, ...] = ()) -> tuple[torch.Tensor, torch.Tensor | None]:
    """tokens, positions [B] (one new token per sequence) -> logits [B, vocab], hidden [B, ...] or None."""
    return model.decode_step(tokens, positions, caches, capture=capture)


def forward(model, tokens: torch.Tensor, positions: torch.Tensor, caches: list, counts: list[int],
            tree_masks: list | None = None, capture: tuple[int, ...] = (),
            last_only: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """tokens, positions [N]: counts[b] rows of sequence b, in order; caches[b] its cache;
    tree_masks[b] a bool [T_b, T_b] ancestor mask, or None (causal rows).

    Writes each sequence's K/V at caches[b].length without committing. Returns logits
    [N, vocab] fp32 (last_only: [B, vocab], each sequence's last row; a hybrid then commits
    all its rows) and hidden [N, len(capture) * H] or None.
    """
    return model.forward_packed(tokens, positions, caches, counts, tree_masks, capture=capture, last_only=last_only)
