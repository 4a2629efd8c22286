"""SamplingParams and the logits -> probabilities -> token path: every token the engine draws,
plain or speculative, is a sequence's `PositionalDraws.choose`.

Greedy is temperature 0 (below MIN_TEMPERATURE: the T -> 0 limit, since float32 cannot
divide logits by a denormal temperature without inf/nan probabilities). Filtering order follows common servers: temperature, then top-k,
then top-p (nucleus), renormalised. Randomness only ever comes from a torch.Generator the
caller seeds, so a request with a seed is reproducible.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

MIN_TEMPERATURE = 1e-5     # below this, sampling is the argmax (the same cut-off vLLM uses)


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1            # -1 or 0: no top-k
    seed: int | None = None

    def __post_init__(self):
        if self.temperature < 0:
            raise ValueError(f"temperature={self.temperature} must be >= 0")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p={self.top_p} must be in (0, 1]")
        if self.top_k < -1:
            raise ValueError(f"top_k={self.top_k} must be -1 (off) or >= 1")

    @property
    def greedy(self) -> bool:
        return self.temperature < MIN_TEMPERATURE or self.top_k == 1


def logits_to_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """logits [..., vocab] -> probs [..., vocab] float32 after temperature/top-k/top-p.

    Greedy params give a one-hot at the argmax, so verifiers can treat both cases alike.
    """
    logits = logits.float()
    if params.greedy:
        return torch.zeros_like(logits).scatter_(-1, logits.argmax(-1, keepdim=True), 1.0)
    logits = logits / params.temperature
    if params.top_k > 0 and params.top_k < logits.shape[-1]:
        kth = logits.topk(params.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = logits.softmax(-1)
    if params.top_p < 1.0:
        probs = _nucleus(probs, params.top_p)
    return probs


def _nucleus(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    # keep the smallest prefix of the sorted distribution whose mass reaches top_p; the most likely
    # token always stays, even when top_p (say 1e-300) rounds to 0 in float32
    sorted_probs, order = probs.sort(-1, descending=True)
    mass_before = sorted_probs.cumsum(-1) - sorted_probs
    drop = mass_before >= top_p
    drop[..., 0] = False
    sorted_probs = sorted_probs.masked_fill(drop, 0.0)
    kept = torch.zeros_like(probs).scatter_(-1, order, sorted_probs)
    return kept / kept.sum(-1, keepdim=True)


class PositionalDraws:
    """A sequence's random draws, keyed by the position of the token being drawn.

    Row i of `choose` is one sample from its filtered distribution with a generator seeded
    from (seed, positions[i]) alone, so the token a seeded sequence gets at a position never
    depends on how its decoding was cut into rounds: plain steps, speculative rounds (tree rows
    at one depth share the draw, and only one of them is ever committed) or a batch with other
    sequences. Each committed token is still an independent exact sample: its draw is fresh
    at its position, and which row is committed depends only on earlier positions' draws.
    """

    def __init__(self, seed: int, device="cpu"):
        self.seed = seed
        self.generator = torch.Generator(device=device)

    def choose(self, logits: torch.Tensor, params: SamplingParams, positions) -> torch.Tensor:
        """logits [N, vocab], positions [N] (of the tokens drawn) -> LongTensor [N]."""
        if params.greedy:
            return logits.argmax(-1)
        probs = logits_to_probs(logits, params)
        out = torch.empty(probs.shape[0], dtype=torch.long, device=probs.device)
        for i, position in enumerate(torch.as_tensor(positions).tolist()):
            self.generator.manual_seed((self.seed * 0x9E3779B97F4A7C15 + position * 0xBF58476D1CE4E5B9) % (1 << 63))
            out[i] = torch.multinomial(probs[i], 1, generator=self.generator)[0]
        return out
