"""The speculative Decoder (docs/contracts.md section 3): draft, verify once, walk, commit.

One round: the drafter proposes per-depth logits after the bonus token; the verifier shapes
them into a tree rooted at the bonus (a chain for DFlash); the target runs every tree row in
one pass (ancestor-only mask when the verifier needs it); the walk follows the target's own
choice per row; the target KV cache keeps the accepted path; the drafter receives the
features of the accepted rows. Lossless: every committed token is the target's choice
(greedy) or an independent target sample (sampling) given the committed prefix.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from serving.sampling import SamplingParams, choose

from .base import Method
from .tree import chain_tree, visibility, walk


@dataclass
class RoundTimes:
    """Seconds spent per phase, summed over rounds (the benchmark reads these)."""

    rounds: int = 0
    accepted: int = 0  # tokens committed by rounds, bonus included
    draft: float = 0.0
    tree: float = 0.0  # tree build + mask
    verify: float = 0.0
    accept: float = 0.0  # choices, walk, KV compaction, draft context update

    @property
    def tau(self) -> float:
        return self.accepted / self.rounds if self.rounds else 0.0


class SpecDecoder:
    """Owns one target KV cache (with room for a full tree) reused by every sequence."""

    def __init__(self, target, method: Method, capacity: int, seed: int = 0):
        self.target, self.method, self.needs = target, method, method.needs
        self.capacity = capacity
        self.cache = target.new_cache(capacity + self.needs.draft_tokens)
        self.generator = torch.Generator(device=target.device)
        self.default_seed, self.sequences = seed, 0
        self.sampling = SamplingParams()
        self.last_accept_length = 1
        self.times = RoundTimes()

    @property
    def server_args(self) -> dict:
        """Resolved speculative arguments for /server_info and /metrics."""
        return {"speculative_algorithm": self.method.name.upper(),
                "speculative_num_draft_tokens": self.method.drafter.needs.draft_tokens,
                "speculative_ddtree_budget": getattr(self.method.verifier, "budget", None)}

    def start(self, prompt_ids: list[int], sampling: SamplingParams, max_new_tokens: int) -> list[int]:
        """Prefill the prompt (capturing the drafter's target layers); return the first token."""
        target, drafter, n = self.target, self.method.drafter, len(prompt_ids)
        if not prompt_ids:
            raise ValueError("prompt must contain at least one token")
        if n + max_new_tokens > self.capacity:
            raise ValueError(f"prompt ({n}) + max_new_tokens ({max_new_tokens}) exceeds the context ({self.capacity})")
        self.sampling, self.sequences = sampling, self.sequences + 1
        # Seeded exactly as ARDecoder seeds, so a seeded request is reproducible per method.
        self.generator.manual_seed(sampling.seed if sampling.seed is not None
                                   else self.default_seed * 1_000_003 + self.sequences)
        self.cache.truncate(0)
        tokens = torch.tensor(prompt_ids, dtype=torch.long, device=target.device)
        positions = torch.arange(n, device=target.device)
        logits, hidden = target.forward(tokens, positions, self.cache, capture=self.needs.target_layers,
                                        last_only=True)
        self.cache.commit(n)
        drafter.reset()
        drafter.extend(hidden[:, : drafter.feature_width], positions)
        self.bonus, self.start_pos = self._choose(logits)[0], n
        self.remaining = max_new_tokens - 1
        self.last_accept_length = 1
        return [self.bonus]

    def _choose(self, logits: torch.Tensor) -> list[int]:
        """One independent target draw (or argmax) per row: [T, vocab] -> T tokens."""
        return choose(logits, self.sampling, self.generator).tolist()

    def _depth(self) -> int:
        # Never draft past max_new_tokens (the round would be wasted) or the trained block.
        return max(0, min(self.method.drafter.needs.draft_tokens - 1, self.remaining - 1))

    def step(self) -> list[int]:
        target, drafter, verifier, times = self.target, self.method.drafter, self.method.verifier, self.times
        t0 = time.perf_counter()
        depth = self._depth()
        draft_logits = drafter.propose(self.bonus, self.start_pos, depth) if depth else None
        t1 = time.perf_counter()
        rows = self.cache.capacity - self.cache.length
        tree = verifier.plan(self.bonus, draft_logits, rows) if depth else chain_tree(self.bonus, [])
        mask = visibility(tree).to(target.device) if self.needs.tree_attention else None
        positions = torch.tensor(tree.positions(self.start_pos), device=target.device)
        tokens = torch.tensor(tree.tokens, device=target.device)
        t2 = time.perf_counter()
        logits, hidden = target.forward(tokens, positions, self.cache, tree_mask=mask,
                                        capture=self.needs.target_layers)
        t3 = time.perf_counter()
        path, bonus = walk(tree, self._choose(logits))
        self.cache.keep(path)
        index = torch.tensor(path, device=target.device)
        drafter.extend(hidden[index, : drafter.feature_width], positions[index])
        committed = [tree.tokens[i] for i in path[1:]] + [bonus]
        self.bonus, self.start_pos = bonus, self.start_pos + len(path)
        self.remaining -= len(committed)
        self.last_accept_length = len(committed)
        t4 = time.perf_counter()
        times.rounds, times.accepted = times.rounds + 1, times.accepted + len(committed)
        times.draft, times.tree, times.verify, times.accept = (
            times.draft + t1 - t0, times.tree + t2 - t1, times.verify + t3 - t2, times.accept + t4 - t3)
        return committed
