"""BatchRunner: the scheduler's model work for every running sequence of a dense target.

KV: one `KVPool` of `--max-total-tokens` rows (default: one full-context request plus its
verify rows, the figure ddops' fit predicts), and with a speculative method a draft K/V pool of
as many rows beside it (serving.speculative.lane). Admission reserves prompt + max_tokens +
verify rows for the whole life of the sequence, the same range of both pools, so admitted
sequences never run out of room, nothing is ever preempted and nothing is allocated per
sequence; a request that does not fit yet waits.

Plain decoding: one `batched.decode_step` for all decoding sequences per round. Prefill: the
next chunk of every prefilling sequence of a step packed into one `batched.forward` (each
chunk's attention is its own causal one; chunk boundaries are fixed per prompt), so a burst
of new prompts reads the weights once, not once per prompt. A prompt's blocks that an earlier
prompt already computed (a chat template's system prompt) are copied from the
serving.engine.prefix_cache instead (dense targets; its store is preallocated at start; none
with --disable-radix-cache).
Each sequence samples with its own `PositionalDraws`, seeded from the request's seed (or the
server seed and an arrival counter), as ARDecoder seeds.

Speculative methods: every round is one batched speculative round for all decoding
sequences (serving.speculative.lane: one draft pass, one target forward over every sequence's
tree, per-sequence walk and KV compaction); its adaptive controller may choose plain rows per
batch size. Lossless: every committed token is the target's own choice.
"""

from __future__ import annotations

import torch

from serving.contract.runtime import DEFAULT_MAX_RUNNING, kv_rows
from serving.engine.hybrid_pool import pool_for
from serving.engine.prefix_cache import BLOCK, PrefixCache
from serving.models import batched
from serving.models.packing import row_slices
from serving.sampling import PositionalDraws


class BatchRunner:
    def __init__(self, target, method=None, capacity: int = 2048, max_running: int | None = None,
                 max_total_tokens: int | None = None, seed: int = 0, adaptive: bool = False,
                 prefix_cache: bool = True):
        from serving.speculative.lane import SpecLane

        self.target, self.capacity = target, capacity
        self.verify_rows = method.needs.draft_tokens if method is not None else 0
        rows = kv_rows(target.config.hybrid, method is not None, capacity, self.verify_rows, max_total_tokens)
        self.spec = SpecLane(target, method, rows, adaptive) if method is not None else None
        self.max_running = max_running or DEFAULT_MAX_RUNNING
        self.pool = pool_for(target, rows, self.max_running)
        width = self.spec.width if self.spec else 0      # the drafter's features are kept with the K/V
        self.prefix = (PrefixCache.for_model(target.config, target.dtype, target.device, width)
                       if prefix_cache and batched.supports(target) else None)     # hybrids: state, not rows
        self.default_seed, self.sequences = seed, 0

    @property
    def server_args(self) -> dict:
        return self.spec.server_args if self.spec else {}

    def fits(self, prompt_tokens: int, max_new_tokens: int) -> bool:
        return prompt_tokens + max_new_tokens + self.verify_rows <= self.pool.capacity

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
        seq.state.update(cache=cache, draws=draws, next=None)
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
        logits, hidden = self._prompt_pass(seqs, spans, rows)
        out = []
        for i, (seq, (b, e), own) in enumerate(zip(seqs, spans, rows)):
            seq.state["cache"].commit(e - b)
            seq.prefilled = e
            if self.spec:
                self.spec.record(seq, hidden[own])
                if self.prefix is not None:     # kept with the prompt's blocks at its end
                    seq.state.setdefault("prompt_features", []).append(hidden[own])
            if e == len(seq.prompt) and self.prefix is not None:
                features = seq.state.pop("prompt_features", None)
                self.prefix.store(seq.prompt, seq.state["cache"], torch.cat(features) if features else None)
            out.append([self._choose(seq, logits[i:i + 1], e)] if e == len(seq.prompt) else [])
        return out

    def _reuse(self, seq) -> None:
        """Copy the prompt's cached prefix blocks into its own rows instead of computing them."""
        blocks = self.prefix.lookup(seq.prompt)
        if not blocks:
            return
        features = self.prefix.copy(blocks, seq.state["cache"])
        seq.prefilled = len(blocks) * BLOCK
        if self.spec:
            self.spec.record(seq, features)
            seq.state["prompt_features"] = [features]

    def _prompt_pass(self, seqs, spans, rows: list[slice]):
        """logits [B, vocab] of each chunk's last row, captured features [N, F] (or None)."""
        device, capture = self.target.device, self.spec.layers if self.spec else ()
        chunks = [torch.tensor(s.prompt[b:e], dtype=torch.long, device=device) for s, (b, e) in zip(seqs, spans)]
        positions = [torch.arange(b, e, device=device) for b, e in spans]
        if not batched.supports(self.target):      # hybrids: each chunk through the one-sequence forward
            outs = [self.target.forward(t, p, s.state["cache"], capture=capture, last_only=True)
                    for t, p, s in zip(chunks, positions, seqs)]
            return torch.cat([o[0] for o in outs]), torch.cat([o[1] for o in outs]) if capture else None
        last = torch.tensor([r.stop - 1 for r in rows], device=device)         # each chunk's last row
        return batched.forward(self.target, torch.cat(chunks), torch.cat(positions), [s.state["cache"] for s in seqs],
                               [r.stop - r.start for r in rows], capture=capture, logit_rows=last)

    def decode(self, seqs) -> list[list[int]]:
        if self.spec:
            return self.spec.round(seqs)
        caches = [s.state["cache"] for s in seqs]
        device = self.target.device
        tokens = torch.tensor([s.state["next"] for s in seqs], dtype=torch.long, device=device)
        positions = torch.tensor([c.length for c in caches], device=device)
        logits, _ = batched.decode_step(self.target, tokens, positions, caches)   # [B, vocab]
        picks = []   # each on the device; one download for the batch, not one per sequence
        for b, seq in enumerate(seqs):
            caches[b].commit(1)
            picks.append(seq.state["draws"].choose(logits[b:b + 1], seq.request.sampling, [caches[b].length]))
        tokens = torch.cat(picks).tolist()
        for seq, token in zip(seqs, tokens):
            seq.state["next"] = token
        return [[token] for token in tokens]

    def release(self, seq) -> None:
        self.pool.release(seq.state.pop("cache"))
        if self.spec:
            self.spec.forget(seq)

    @staticmethod
    def _choose(seq, logits: torch.Tensor, position: int) -> int:
        """logits [1, vocab] -> the token at `position`."""
        token = int(seq.state["draws"].choose(logits, seq.request.sampling, [position])[0])
        seq.state["next"] = token
        return token
