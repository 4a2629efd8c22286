"""The scheduler: admitted sequences in flight, one engine step at a time.

A step runs prefill chunks (whole chunks, FIFO, up to `--chunked-prefill-size` tokens in all,
at least one; the runner packs them into one pass) for sequences still reading their prompt, then one decode round for every
sequence that has its first token. Text, stops and max_tokens go through each sequence's
`TextAssembler`; finished and cancelled sequences leave the running set and free their rows.

The runner (serving.engine.runner.Runner, the batch runner) does the model work.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from serving.engine.events import Delta, Failed, Finished, GenerationRequest
from serving.engine.stats import Usage
from serving.engine.stops import TextAssembler

if TYPE_CHECKING:
    from serving.engine.batch import SequenceState

log = logging.getLogger("serving.engine")


@dataclass
class RunningSequence:
    request: GenerationRequest
    text: TextAssembler
    began: float
    prefilled: int = 0                  # prompt tokens already in the KV cache
    started: bool = False               # the first token is out
    ttft: float = 0.0
    rounds: int = 0
    accepted: int = 0
    trials: int = 0                     # drafted trees followed to their end (serving.speculative.tree.Trial)
    trial_accepted: float = 0.0         # drafts those trees' walks accepted, at the method's widest width
    trial_weight: float = 0.0           # those trees, each weighted by the tokens its window stands for
    state: SequenceState | None = None  # the runner's, while admitted

    @property
    def prompt(self) -> list[int]:
        return self.request.prompt_ids

    @property
    def remaining(self) -> int:
        return self.request.rule.max_new_tokens - len(self.text.ids)


class Scheduler:
    def __init__(self, runner, tokenizer, deliver, record, chunk_tokens: int = 512):
        self.runner, self.tokenizer, self.chunk_tokens = runner, tokenizer, chunk_tokens
        self.deliver, self.record = deliver, record      # (request, event) -> None; (usage) -> None
        self.running: list[RunningSequence] = []

    def admit(self, request, began: float) -> bool:
        """Start `request` now if the runner has room; False leaves it waiting."""
        if len(self.running) >= self.runner.max_running:
            return False
        seq = RunningSequence(request, TextAssembler(request.rule, self.tokenizer.decode), began)
        if not self.runner.admit(seq):
            return False
        self.running.append(seq)
        return True

    def step(self) -> None:
        for seq in [s for s in self.running if s.request.cancelled.is_set()]:
            self._finish(seq)
        self._prefill()
        decoding = [s for s in self.running if s.started and not s.text.finish_reason]
        if decoding:
            self._decode(decoding)
        for seq in [s for s in self.running if s.text.finish_reason]:
            self._finish(seq)

    def _prefill(self) -> None:
        pack, budget = [], self.chunk_tokens
        for seq in [s for s in self.running if not s.started]:
            if budget <= 0:
                break
            pack.append(seq)
            budget -= min(len(seq.prompt) - seq.prefilled, self.chunk_tokens)
        if not pack:
            return
        try:
            firsts = self.runner.prefill(pack, self.chunk_tokens)
        except Exception as e:  # one bad request must not take the others down: retry them one by one
            if len(pack) == 1:
                self._fail(pack[0], e)
                return
            firsts = [self._prefill_alone(seq) for seq in pack]
        for seq, tokens in zip(pack, firsts):
            if tokens:
                seq.started, seq.ttft = True, time.perf_counter() - seq.began
                self._emit(seq, tokens)

    def _prefill_alone(self, seq: RunningSequence) -> list[int]:
        try:
            return self.runner.prefill([seq], self.chunk_tokens)[0]
        except Exception as e:
            self._fail(seq, e)
            return []

    def _decode(self, seqs: list[RunningSequence]) -> None:
        try:
            rounds = self.runner.decode(seqs)
        except Exception as e:
            for seq in seqs:
                self._fail(seq, e)
            return
        for seq, tokens in zip(seqs, rounds):
            seq.rounds, seq.accepted = seq.rounds + 1, seq.accepted + len(tokens)
            self._emit(seq, tokens)

    def _emit(self, seq: RunningSequence, tokens: list[int]) -> None:
        before = len(seq.text.ids)
        delta = seq.text.feed(tokens)
        if delta:
            self.deliver(seq.request, Delta(delta, tuple(seq.text.ids[before:])))

    def _finish(self, seq: RunningSequence) -> None:
        self._leave(seq)
        usage = Usage(len(seq.prompt), len(seq.text.ids), seq.rounds, seq.accepted,
                      seq.ttft, time.perf_counter() - seq.began, seq.trials, seq.trial_accepted,
                      seq.trial_weight)
        self.record(usage)
        self.deliver(seq.request, Finished(seq.text.text, tuple(seq.text.ids),
                                           seq.text.finish_reason or "abort", usage))

    def _fail(self, seq: RunningSequence, error: Exception) -> None:
        log.error("generation failed", exc_info=error)
        self._leave(seq)
        self.deliver(seq.request, Failed(f"generation failed: {error}"))

    def _leave(self, seq: RunningSequence) -> None:
        if seq in self.running:
            self.running.remove(seq)
            self.runner.release(seq)
