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

from serving.sampling import PositionalDraws, SamplingParams

from .base import Method
from .adaptive import Controller, Setting, widths
from .tree import Tree, ancestors, chain_tree, walk


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


def settings(method: Method, adaptive: bool) -> list[Setting]:
    """The method's fixed setting, or (adaptive) plain decoding plus verify widths up to it.

    Tree verifiers vary the node budget (rows = budget + 1), chain verifiers the block length;
    the verifier's own width bounds them (the drafter's block may be wider than a small budget)."""
    rows = method.verifier.needs.draft_tokens
    if method.needs.tree_attention:
        fixed = [Setting(f"budget {b}", b + 1) for b in widths(rows - 1)]
    else:
        fixed = [Setting(f"block {b}", b) for b in widths(rows)]
    return [Setting("plain", 1)] + fixed if adaptive else fixed[-1:]


def draft_depth(block: int, rows: int, room: int) -> int:
    """Never deeper than the trained block, the tokens still wanted, or the verify rows can hold."""
    return max(0, min(block - 1, room - 1, rows - 1))


def drafts_cut(block: int, rows: int, room: int) -> bool:
    """A request's last tokens (`room` left) keep a round from drafting its setting's full depth."""
    return room < min(block, rows)


class SpecDecoder:
    """Owns one target KV cache (with room for a full tree) reused by every sequence.

    Device traffic per round: one upload (the tree's tokens, depths and parents packed in one
    tensor) and one download (the target's choice per row); the bonus token and the accepted
    path stay on the device, so the draft block and KV compaction need no further upload."""

    def __init__(self, target, method: Method, capacity: int, seed: int = 0, prefill_chunk: int = 512,
                 adaptive: bool = False):
        self.target, self.method, self.needs = target, method, method.needs
        self.controller = Controller(settings(method, adaptive))
        self.adaptive, self.forced = adaptive, False
        self.capacity, self.prefill_chunk = capacity, prefill_chunk
        rows = capacity + self.needs.draft_tokens
        self.cache = target.new_cache(rows)
        self.context = method.drafter.context(method.drafter.pool(rows), 0, rows)
        self.draws = PositionalDraws(seed, target.device)
        self.default_seed, self.sequences = seed, 0
        self.sampling = SamplingParams()
        self.last_accept_length = 1
        self.times = RoundTimes()

    @property
    def server_args(self) -> dict:
        """Resolved speculative arguments for /server_info and /metrics, with the adaptive
        controller's current choice and what it measured per setting."""
        return {"speculative_algorithm": self.method.name.upper(),
                "speculative_num_draft_tokens": self.method.drafter.needs.draft_tokens,
                "speculative_ddtree_budget": getattr(self.method.verifier, "budget", None),
                "speculative_adaptive": self.adaptive,
                "speculative_current_setting": self.controller.current.label,
                "speculative_settings": self.controller.report()}

    def force_speculation(self) -> None:
        """The next round runs the widest setting whatever the controller prefers (the
        /health_generate probe: proves speculation works while plain is preferred)."""
        self.forced = True

    def start(self, prompt_ids: list[int], sampling: SamplingParams, max_new_tokens: int) -> list[int]:
        """Prefill the prompt in chunks (capturing the drafter's target layers); return the first token."""
        target, drafter, n = self.target, self.method.drafter, len(prompt_ids)
        if not prompt_ids:
            raise ValueError("prompt must contain at least one token")
        if n + max_new_tokens > self.capacity:
            raise ValueError(f"prompt ({n}) + max_new_tokens ({max_new_tokens}) exceeds the context ({self.capacity})")
        self.sampling, self.sequences = sampling, self.sequences + 1
        # Seeded exactly as ARDecoder seeds, so a seeded request is reproducible per method.
        self.draws.seed = (sampling.seed if sampling.seed is not None
                           else self.default_seed * 1_000_003 + self.sequences)
        self.cache.truncate(0)
        self.context.cache.truncate(0)
        self.context.pending = []
        tokens = torch.tensor(prompt_ids, dtype=torch.long, device=target.device)
        for begin in range(0, n, self.prefill_chunk):
            end = min(begin + self.prefill_chunk, n)
            logits, hidden = target.forward(tokens[begin:end], torch.arange(begin, end, device=target.device),
                                            self.cache, capture=self.needs.target_layers, last_only=True)
            self.cache.commit(end - begin)
            drafter.extend(self.context, hidden[:, : drafter.feature_width])
        choice = self._choose(logits, [n])
        self.bonus, self.bonus_on_device, self.start_pos = int(choice[0]), choice, n
        self.remaining = max_new_tokens - 1
        self.last_accept_length = 1
        return [self.bonus]

    def _choose(self, logits: torch.Tensor, positions) -> torch.Tensor:
        """One target draw (or argmax) per row, keyed by the position it fills: [T, vocab] -> [T] on the device."""
        return self.draws.choose(logits, self.sampling, positions)

    def _depth(self, rows: int, forced: bool) -> int:
        # Never past max_new_tokens (the round would be wasted; a forced probe round drafts a
        # full block anyway, the engine cuts the output).
        block = self.method.drafter.needs.draft_tokens
        return draft_depth(block, rows, block if forced else self.remaining)

    def _verify_inputs(self, tree: Tree):
        """tokens [T], positions [T], mask (None: causal) and ancestor table, from one upload."""
        packed = torch.tensor((tree.tokens, tree.depths, tree.parents), device=self.target.device)  # [3, T]
        tokens, positions = packed[0], packed[1] + self.start_pos
        if tree.is_chain:
            return tokens, positions, None, None
        table = ancestors(packed[2], max(tree.depths))  # [T, depth + 1]
        vis = torch.zeros(len(tree), len(tree), dtype=torch.bool, device=table.device).scatter_(1, table, True)
        return tokens, positions, vis, table

    def _commit(self, tree: Tree, path: list[int], table, hidden: torch.Tensor) -> None:
        """Keep the accepted rows' KV and give their features to the drafter."""
        width = self.method.drafter.feature_width
        if path[-1] == len(path) - 1:  # rows 0..k: already in place, nothing to move
            self.cache.commit(len(path))
            self.method.drafter.extend(self.context, hidden[: len(path), :width])
            return
        rows = table[path[-1], : len(path)].flip(0)  # root .. last accepted row, on the device
        self.cache.keep(rows)
        self.method.drafter.extend(self.context, hidden[rows, :width])

    def step(self) -> list[int]:
        target, drafter, verifier, times = self.target, self.method.drafter, self.method.verifier, self.times
        t0 = time.perf_counter()
        setting = self.controller.settings[-1] if self.forced else self.controller.choose()
        full = self.forced or not drafts_cut(self.method.drafter.needs.draft_tokens, setting.rows, self.remaining)
        depth, self.forced = self._depth(setting.rows, self.forced), False
        draft_logits = drafter.propose([self.context], [self.bonus], [depth])[0] if depth else None
        t1 = time.perf_counter()
        rows = min(setting.rows, self.cache.capacity - self.cache.length)
        tree = verifier.plan(self.bonus, draft_logits, rows, drafter.vocab) if depth else chain_tree(self.bonus, [])
        tokens, positions, mask, table = self._verify_inputs(tree)
        t2 = time.perf_counter()
        logits, hidden = target.forward(tokens, positions, self.cache, tree_mask=mask,
                                        capture=self.needs.target_layers)
        t3 = time.perf_counter()
        choices = self._choose(logits, positions + 1)
        path, bonus = walk(tree, choices.tolist())
        self._commit(tree, path, table, hidden)
        committed = [tree.tokens[i] for i in path[1:]] + [bonus]
        self.bonus, self.bonus_on_device = bonus, choices[path[-1]: path[-1] + 1]
        self.start_pos += len(path)
        self.remaining -= len(committed)
        self.last_accept_length = len(committed)
        t4 = time.perf_counter()
        self.controller.record(setting, len(committed), t4 - t0, full)
        times.rounds, times.accepted = times.rounds + 1, times.accepted + len(committed)
        times.draft, times.tree, times.verify, times.accept = (
            times.draft + t1 - t0, times.tree + t2 - t1, times.verify + t3 - t2, times.accept + t4 - t3)
        return committed
