"""What a shadow learns from mirrored requests: pure counting, bounded in memory.

Deterministic records (temperature 0, or a seed) are compared token by token against the
answer production actually sent: `matched` is the common prefix of the two id sequences,
`compared` the longer one (after the first difference the two continuations condition on
different text). Other records are compared by distribution: completion length and finish
reason on each side. A record that carries production's answer as text only (a streamed vLLM
chat, from the relay) is compared by text, kept apart so `token_equality` keeps its meaning:
`matched_chars` is the common prefix of the two texts, `compared_chars` the longer one. A
non-deterministic text record has no production length in tokens nor finish reason: it joins
the distribution on the shadow's side only and is counted apart (`text.sampled`). The
shadow's own figures (accepted length, TTFT, ITL, tokens/s) come from its engine's `Usage` of
each regenerated answer.

Everything kept grows with the number of distinct finish reasons (capped) and the fixed
windows below, never with the number of requests.
"""

from __future__ import annotations

import math
import re
from collections import Counter, deque
from dataclasses import dataclass, field

WINDOW = 1024          # latest TTFT / ITL values kept for percentiles
MAX_REASONS = 8        # distinct finish-reason labels; more are counted as "other"
MAX_SAMPLES = 16       # stored samples (only for records production marked `sample`)
SAMPLE_CHARS = 2000    # each stored text is cut to this many characters
# Secrets a prompt may carry: OpenAI-style keys, bearer tokens, `api_key = ...` assignments.
SECRET = re.compile(r"(sk-[A-Za-z0-9_-]{8,}|(?i:bearer)\s+[A-Za-z0-9._~+/=-]+|"
                    r"(?i:api[_-]?key)[\"']?\s*[:=]\s*[\"']?[^\s\"',}]+)")


def redact(text: str, keys: tuple[str, ...] = ()) -> str:
    """`text` with each key (the servers' own) and anything shaped like a secret replaced."""
    for key in keys:
        if key:
            text = text.replace(key, "[redacted]")
    return SECRET.sub("[redacted]", text)


def percentile(values, q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100.0
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def common_prefix(a, b) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


@dataclass
class Side:
    """Completion lengths and finish reasons of one side on non-deterministic records."""

    requests: int = 0
    tokens: int = 0
    reasons: Counter = field(default_factory=Counter)

    def add(self, length: int, reason: str) -> None:
        self.requests += 1
        self.tokens += length
        if reason not in self.reasons and len(self.reasons) >= MAX_REASONS:
            reason = "other"
        self.reasons[reason] += 1

    def to_dict(self) -> dict:
        return {"requests": self.requests, "mean_length": self.tokens / self.requests if self.requests else None,
                "finish_reasons": dict(self.reasons)}


@dataclass
class Tally:
    received: int = 0
    dropped: int = 0          # the shadow's queue was full
    failed: int = 0           # the shadow could not generate (busy, failed, timed out)
    deterministic: int = 0
    equal: int = 0
    matched: int = 0
    compared: int = 0
    text: int = 0             # deterministic records compared by text
    text_equal: int = 0
    text_matched: int = 0     # characters
    text_compared: int = 0
    text_sampled: int = 0     # non-deterministic text records (the shadow's side of the distribution)
    production: Side = field(default_factory=Side)
    shadow: Side = field(default_factory=Side)
    rounds: int = 0
    accepted: int = 0         # tokens the shadow's decoder rounds committed
    trials: int = 0           # the shadow's drafted trees followed to their end (Usage.trials)
    trial_accepted: float = 0.0   # drafts their walks accepted at the method's widest width (weighted)
    trial_weight: float = 0.0     # their weights (Usage.trial_weight)
    tokens: int = 0
    seconds: float = 0.0      # the shadow's total generation time over `tokens`
    ttft: deque = field(default_factory=lambda: deque(maxlen=WINDOW))
    itl: deque = field(default_factory=lambda: deque(maxlen=WINDOW))
    samples: deque = field(default_factory=lambda: deque(maxlen=MAX_SAMPLES))

    def add(self, deterministic: bool, expected: tuple, expected_reason: str, got: tuple,
            got_reason: str, usage) -> bool:
        """One regenerated record; `usage` is the shadow's serving.engine Usage. True: equal."""
        if deterministic:
            same = common_prefix(expected, got)
            self.deterministic += 1
            self.matched += same
            self.compared += max(len(expected), len(got))
            self.equal += tuple(expected) == tuple(got)
        else:
            self.production.add(len(expected), expected_reason)
            self.shadow.add(len(got), got_reason)
        self._usage(usage)
        return deterministic and tuple(expected) == tuple(got)

    def add_text(self, deterministic: bool, expected: str, got: str, got_length: int, got_reason: str,
                 usage) -> bool:
        """One regenerated record whose production answer is text only. True: equal."""
        if deterministic:
            self.text += 1
            self.text_matched += common_prefix(expected, got)
            self.text_compared += max(len(expected), len(got))
            self.text_equal += expected == got
        else:
            self.text_sampled += 1
            self.shadow.add(got_length, got_reason)
        self._usage(usage)
        return deterministic and expected == got

    def _usage(self, usage) -> None:
        self.rounds += usage.rounds
        self.accepted += usage.accepted
        self.trials += usage.trials
        self.trial_accepted += usage.trial_accepted
        self.trial_weight += usage.trial_weight
        self.tokens += usage.completion_tokens
        self.seconds += usage.total_s
        self.ttft.append(usage.ttft_s)
        if usage.completion_tokens > 1:
            self.itl.append((usage.total_s - usage.ttft_s) / (usage.completion_tokens - 1))

    def keep_sample(self, prompt: str, production: str, shadow: str, keys: tuple[str, ...]) -> None:
        self.samples.append({name: redact(text, keys)[:SAMPLE_CHARS] for name, text in
                             (("prompt", prompt), ("production", production), ("shadow", shadow))})

    def accept_length(self) -> float | None:
        """The draft's accepted length on the mirrored traffic: tokens a round at the configured
        width commits, from the shadow's trials, so an adaptive shadow that ran plain rounds still
        says what its draft would accept; without trials (a plain shadow, or answers too short to
        finish one), tokens per round as run."""
        if self.trial_weight:
            return 1.0 + self.trial_accepted / self.trial_weight
        return self.accepted / self.rounds if self.rounds else None

    def to_dict(self) -> dict:
        equality = self.matched / self.compared if self.compared else (1.0 if self.deterministic else None)
        by_text = self.text_matched / self.text_compared if self.text_compared else (1.0 if self.text else None)
        return {
            "received": self.received, "dropped": self.dropped, "failed": self.failed,
            "compared": self.deterministic + self.production.requests + self.text + self.text_sampled,
            "deterministic": {"requests": self.deterministic, "equal": self.equal,
                              "matched_tokens": self.matched, "compared_tokens": self.compared,
                              "token_equality": equality},
            "text": {"requests": self.text, "equal": self.text_equal, "matched_chars": self.text_matched,
                     "compared_chars": self.text_compared, "text_equality": by_text,
                     "sampled": self.text_sampled},
            "distribution": {"production": self.production.to_dict(), "shadow": self.shadow.to_dict()},
            "shadow": {"accept_length": self.accept_length(),
                       "tokens_per_round": self.accepted / self.rounds if self.rounds else None,
                       "trials": self.trials,
                       "ttft_p50_s": percentile(self.ttft, 50), "ttft_p95_s": percentile(self.ttft, 95),
                       "ttft_p99_s": percentile(self.ttft, 99),
                       "itl_p50_s": percentile(self.itl, 50), "itl_p95_s": percentile(self.itl, 95),
                       "itl_p99_s": percentile(self.itl, 99),
                       "tokens_per_s": self.tokens / self.seconds if self.seconds > 0 else None,
                       "completion_tokens": self.tokens},
            "samples": list(self.samples),
        }
