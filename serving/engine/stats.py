"""Running statistics the engine keeps for /server_info and /metrics."""

from __future__ import annotations

import threading
from dataclasses import dataclass


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int
    rounds: int              # decoder rounds after the prefill
    accepted: int            # tokens those rounds committed
    ttft_s: float
    total_s: float
    trials: int = 0          # measured rounds of the method's widest width (verified or not)
    trial_accepted: float = 0.0  # drafts those rounds accepted, each round weighted as below
    trial_weight: float = 0.0    # those rounds, each weighted by the tokens its window stands for

    @property
    def accept_length(self) -> float:
        """Tokens per round as run: an adaptive sequence's plain rounds count 1 each."""
        return self.accepted / self.rounds if self.rounds else 1.0

    @property
    def draft_accept_length(self) -> float | None:
        """Tokens per round of the method's widest width, bonus included: what its draft accepts,
        whatever its rounds ran (None before a whole-block round ended)."""
        return 1.0 + self.trial_accepted / self.trial_weight if self.trial_weight else None

    @property
    def decode_tokens_per_s(self) -> float:
        decode_s = self.total_s - self.ttft_s
        return (self.completion_tokens - 1) / decode_s if decode_s > 0 and self.completion_tokens > 1 else 0.0


class EngineStats:
    def __init__(self):
        self._lock = threading.Lock()
        self.num_requests_total = 0
        self.rounds = 0
        self.accepted = 0
        self.trials = 0
        self.trial_accepted = 0.0
        self.trial_weight = 0.0
        self.last_gen_throughput = 0.0

    def record(self, usage: Usage) -> None:
        with self._lock:
            self.num_requests_total += 1
            self.rounds += usage.rounds
            self.accepted += usage.accepted
            self.trials += usage.trials
            self.trial_accepted += usage.trial_accepted
            self.trial_weight += usage.trial_weight
            if usage.completion_tokens > 1:
                self.last_gen_throughput = usage.decode_tokens_per_s

    @property
    def avg_spec_accept_length(self) -> float:
        """Tokens per round of the method's widest width since start: what the draft accepts,
        whether the adaptive controller verified those rounds or ran plain beside them (a fixed
        method's are its own rounds; an adaptive one's, its measuring windows' and each answer's
        first, weighted by how often each is sampled: serving.speculative.lane.counts_for).
        Before any, tokens per round as run."""
        if self.trial_weight:
            return 1.0 + self.trial_accepted / self.trial_weight
        return self.accepted / self.rounds if self.rounds else 1.0

    def snapshot(self) -> dict:
        with self._lock:
            return {"avg_spec_accept_length": self.avg_spec_accept_length,
                    "spec_accept_rounds": self.trials,        # the rounds that figure rests on
                    "avg_tokens_per_round": self.accepted / self.rounds if self.rounds else 1.0,   # as run
                    "last_gen_throughput": self.last_gen_throughput,
                    "num_requests_total": self.num_requests_total}
