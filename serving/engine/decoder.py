"""The Decoder protocol (docs/contracts.md section 3) and plain autoregressive decoding."""

from __future__ import annotations

from typing import Protocol

import torch

from serving.sampling import PositionalDraws, SamplingParams


class Decoder(Protocol):
    last_accept_length: int

    def start(self, prompt_ids: list[int], sampling: SamplingParams, max_new_tokens: int) -> list[int]: ...

    def step(self) -> list[int]: ...

    def force_speculation(self) -> None:
        """The next round speculates even if an adaptive controller prefers plain decoding."""


class ARDecoder:
    """One token per round. Owns one KV cache, reused by every sequence it decodes."""

    def __init__(self, model, capacity: int, seed: int = 0, prefill_chunk: int = 512):
        self.model = model
        self.prefill_chunk = prefill_chunk
        self.cache = model.new_cache(capacity)
        self.draws = PositionalDraws(seed, model.device)
        self.default_seed = seed
        self.sequences = 0
        self.last_accept_length = 1
        self.sampling = SamplingParams()
        self.next_token = None

    def start(self, prompt_ids: list[int], sampling: SamplingParams, max_new_tokens: int) -> list[int]:
        """Prefill the prompt; return the first generated token."""
        if not prompt_ids:
            raise ValueError("prompt must contain at least one token")
        if len(prompt_ids) + max_new_tokens > self.cache.capacity:
            raise ValueError(f"prompt ({len(prompt_ids)}) + max_new_tokens ({max_new_tokens}) "
                             f"exceeds the context ({self.cache.capacity})")
        self.sampling = sampling
        self.sequences += 1
        # unseeded requests still differ from each other, yet a server run is reproducible
        self.draws.seed = (sampling.seed if sampling.seed is not None
                           else self.default_seed * 1_000_003 + self.sequences)
        self.cache.truncate(0)
        tokens = torch.tensor(prompt_ids, dtype=torch.long, device=self.model.device)
        positions = torch.arange(len(prompt_ids), device=self.model.device)
        # long prompts go in chunks: the attention mask and MLP activations stay [chunk, ...]
        for begin in range(0, len(prompt_ids) - self.prefill_chunk, self.prefill_chunk):
            chunk = slice(begin, begin + self.prefill_chunk)
            self.model.forward(tokens[chunk], positions[chunk], self.cache, last_only=True)
            self.cache.commit(self.prefill_chunk)
        rest = slice(self.cache.length, len(prompt_ids))
        return self._advance(tokens[rest], positions[rest])

    def force_speculation(self) -> None:
        """Plain decoding has nothing to force."""

    def step(self) -> list[int]:
        position = torch.tensor([self.cache.length], device=self.model.device)
        return self._advance(self.next_token, position)

    def _advance(self, tokens: torch.Tensor, positions: torch.Tensor) -> list[int]:
        logits, _ = self.model.forward(tokens, positions, self.cache, last_only=True)
        self.cache.commit(tokens.shape[0])
        self.next_token = self.draws.choose(logits, self.sampling, [self.cache.length])   # [1]
        self.last_accept_length = 1
        return [int(self.next_token)]
