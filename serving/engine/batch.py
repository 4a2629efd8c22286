"""BatchRunner: the scheduler's model work for every running sequence; the engine's only runner.

KV: one `KVPool` of `--max-total-tokens` rows (default: one full-context request plus its
verify rows, the figure ddops' fit predicts), and with a speculative method a draft K/V pool of
as many rows beside it (serving.speculative.lane). Admission reserves prompt + max_tokens +
verify rows for the whole life of the sequence, the same range of both pools, so admitted
sequences never run out of room, nothing is ever preempted and nothing is allocated per
sequence; a request that does not fit yet waits.

Plain decoding: one `batched.decode_step` for all decoding sequences per round (every target,
hybrids included). Prefill: the next chunk of every
prefilling sequence of a step packed into one `batched.forward` (each chunk's attention is its
own causal one; chunk boundaries are fixed per prompt), so a burst of new prompts reads the
weights once, not once per prompt (a hybrid runs each chunk through its own forward in turn,
inside it). A prompt's blocks that an earlier prompt already computed (a chat
template's system prompt) are copied from the serving.engine.prefix_cache instead (dense
targets; its store is preallocated at start; none with --disable-radix-cache).
Each sequence samples with its own `PositionalDraws`, seeded from the request's seed (or the
server seed and an arrival counter).

Speculative methods: every round is one batched speculative round for all decoding
sequences (serving.speculative.lane: one draft pass, one target forward over every sequence's
tree, per-sequence walk and KV compaction); its adaptive controller may choose plain rows per
batch size. Slot rule: a speculative hybrid runs one sequence at a time (its verify forward is
the one-sequence one, serving.contract.runtime.one_at_a_time), so its pool holds one
sequence's rows and one state slot. Lossless: every committed token is the target's own choice.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from serving import memory
from serving.contract.runtime import DEFAULT_MAX_RUNNING, kv_rows, one_at_a_time
from serving.engine.hybrid_pool import pool_for
from serving.engine.prefix_cache import BLOCK, PrefixCache
from serving.engine.runner import RunnerInfo
from serving.kernel_report import target_kernels
from serving.models import batched
from serving.models.packing import row_slices
from serving.sampling import PositionalDraws
from serving.speculative.lane import SpecLane

if TYPE_CHECKING:
    from serving.models.hybrid_cache import HybridCache
    from serving.models.kv_cache import KVCache
    from serving.speculative.dflash import DraftContext


@dataclass
class SequenceState:
    """The runner's state of one running sequence (`RunningSequence.state`)."""

    cache: KVCache | HybridCache    # its rows of the pool (a HybridCache view, with a state slot, for hybrids)
    draws: PositionalDraws
    next: int | None = None         # the last committed token: the next round's input (the bonus)
    draft: DraftContext | None = None   # with a speculative method
    prompt_features: list = field(default_factory=list)   # [n, F] chunks kept for the prefix store


class BatchRunner:
    def __init__(self, target, method=None, capacity: int = 2048, max_running: int | None = None,
                 max_total_tokens: int | None = None, seed: int = 0, adaptive: bool = False,
                 prefix_cache: bool = True):
        self.target, self.capacity = target, capacity
        self.verify_rows = method.needs.draft_tokens if method is not None else 0
        rows = kv_rows(target.config.hybrid, method is not None, capacity, self.verify_rows, max_total_tokens)
        self.spec = SpecLane(target, method, rows, adaptive) if method is not None else None
        alone = one_at_a_time(target.config.hybrid, method is not None)       # the slot rule
        self.max_running = 1 if alone else max_running or DEFAULT_MAX_RUNNING
        self.pool = pool_for(target, rows, self.max_running)
        width = self.spec.width if self.spec else 0      # the drafter's features are kept with the K/V
        self.prefix = (PrefixCache.for_model(target.config, target.kv_dtype, target.dtype, target.device, width)
                       if prefix_cache and batched.supports(target) else None)     # hybrids: state, not rows
        self.default_seed, self.sequences = seed, 0
        self.kernels = target_kernels(target)     # chosen (a native one built and probed) at start

    @property
    def server_args(self) -> dict:
        return self.spec.server_args if self.spec else {}

    def fits(self, prompt_tokens: int, max_new_tokens: int) -> bool:
        return prompt_tokens + max_new_tokens <= self.max_sequence_tokens

    def admit(self, seq) -> bool:
        if not seq.prompt:
            raise ValueError("prompt must contain at least one token")
        cache = self.pool.reserve(len(seq.prompt) + seq.request.rule.max_new_tokens + self.verify_rows)
        if cache is None:
            return False
        self.sequences += 1
        seed = seq.request.sampling.seed
        # unseeded requests still differ from each other, yet a server run is reproducible
        draws = PositionalDraws(seed if seed is not None else self.default_seed * 1_000_003 + self.sequences,
                                self.target.device)
        seq.state = SequenceState(cache, draws)
        if self.spec:
            self.spec.admit(seq, cache)
        return True

    def prefill(self, seqs, chunk: int) -> list[list[int]]:
        """The next prompt chunk of every sequence in one forward; [first token] for those whose
        prompt is then read, [] for the others. A chunk's rows are [prefilled, prefilled + chunk)
        of its prompt whatever else runs, so chunk boundaries are fixed per prompt (and per
        cached prefix)."""
        for seq in seqs:
            if seq.prefilled == 0 and self.prefix is not None:
                self._reuse(seq)
        spans = [(s.prefilled, min(len(s.prompt), s.prefilled + chunk)) for s in seqs]
        rows = row_slices(e - b for b, e in spans)                  # each chunk's rows of the pass
        logits, hidden = self._prompt_pass(seqs, spans)
        out = []
        for i, (seq, (b, e), own) in enumerate(zip(seqs, spans, rows)):
            seq.state.cache.commit(e - b)
            seq.prefilled = e
            if self.spec:
                self.spec.record(seq, hidden[own])
                if self.prefix is not None:     # kept with the prompt's blocks at its end
                    seq.state.prompt_features.append(hidden[own])
            if e == len(seq.prompt) and self.prefix is not None:
                features, seq.state.prompt_features = seq.state.prompt_features, []
                self.prefix.store(seq.prompt, seq.state.cache, torch.cat(features) if features else None)
            out.append([self._choose(seq, logits[i:i + 1], e)] if e == len(seq.prompt) else [])
        return out

    def _reuse(self, seq) -> None:
        """Copy the prompt's cached prefix blocks into its own rows instead of computing them."""
        blocks = self.prefix.lookup(seq.prompt)
        if not blocks:
            return
        features = self.prefix.copy(blocks, seq.state.cache)
        seq.prefilled = len(blocks) * BLOCK
        if self.spec:
            self.spec.record(seq, features)
            seq.state.prompt_features = [features]

    def _prompt_pass(self, seqs, spans):
        """logits [B, vocab] of each chunk's last row, captured features [N, F] (or None)."""
        device, capture = self.target.device, self.spec.layers if self.spec else ()
        tokens = torch.tensor([t for s, (b, e) in zip(seqs, spans) for t in s.prompt[b:e]], dtype=torch.long,
                              device=device)
        positions = torch.cat([torch.arange(b, e, device=device) for b, e in spans])
        return batched.forward(self.target, tokens, positions, [s.state.cache for s in seqs],
                               [e - b for b, e in spans], capture=capture, last_only=True)

    def decode(self, seqs) -> list[list[int]]:
        if self.spec:
            return self.spec.round(seqs)
        caches = [s.state.cache for s in seqs]
        logits = self._plain_logits(seqs, caches)                                  # [B, vocab]
        picks = logits.argmax(-1)     # [B]: greedy rows in one pass, then each sampled row its own draw
        for b, seq in enumerate(seqs):
            caches[b].commit(1)
            if not seq.request.sampling.greedy:
                picks[b] = seq.state.draws.choose(logits[b:b + 1], seq.request.sampling, [caches[b].length])[0]
        tokens = picks.tolist()   # one download for the batch, not one per sequence
        for seq, token in zip(seqs, tokens):
            seq.state.next = token
        return [[token] for token in tokens]

    def _plain_logits(self, seqs, caches) -> torch.Tensor:
        """One plain step: logits [B, vocab] for each sequence's next token."""
        device = self.target.device
        tokens = torch.tensor([s.state.next for s in seqs], dtype=torch.long, device=device)
        positions = torch.tensor([c.length for c in caches], device=device)
        return batched.decode_step(self.target, tokens, positions, caches)[0]

    def release(self, seq) -> None:
        self.pool.release(seq.state.cache)
        seq.state = None

    def info(self) -> RunnerInfo:
        """Figures for /server_info and /metrics; memory from the pools' own accounting."""
        pools = [self.pool] + ([self.spec.pool] if self.spec else [])
        modules = [self.target] + ([self.spec.drafter.model] if self.spec else [])
        measured = {"weights_bytes": memory.parameter_bytes(modules),
                    "kv_cache_bytes": sum(p.kv_bytes() for p in pools),
                    "state_cache_bytes": self.pool.state_bytes(),
                    "prefix_cache_bytes": self.prefix.store_bytes() if self.prefix else 0}
        return RunnerInfo(speculative=self.server_args, kv_rows=self.pool.capacity,
                          kv_used=self.pool.capacity - self.pool.free_tokens, prefix_cache=self.prefix is not None,
                          prefix_hit_rate=self.prefix.hit_rate if self.prefix else 0.0, memory=measured,
                          kernels=self.kernels, max_sequence_tokens=self.max_sequence_tokens)

    @property
    def max_sequence_tokens(self) -> int:
        """prompt + max_tokens one sequence can hold: the pool less the verify rows it reserves."""
        return self.pool.capacity - self.verify_rows

    @staticmethod
    def _choose(seq, logits: torch.Tensor, position: int) -> int:
        """logits [1, vocab] -> the token at `position`."""
        token = int(seq.state.draws.choose(logits, seq.request.sampling, [position])[0])
        seq.state.next = token
        return token
