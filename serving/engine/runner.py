"""What the scheduler and the server ask of the model runner (serving.engine.batch.BatchRunner).

The scheduler drives it one step at a time (docs/serving.md "Batching"); the engine reads
`fits` before queueing a request and `info()` for /server_info and /metrics, so the server
never looks inside the runner.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class RunnerInfo:
    """The runner's figures, read at one moment."""

    speculative: dict              # resolved speculative arguments, the adaptive controller's state; {} for plain
    kv_rows: int                   # target K/V pool rows
    kv_used: int                   # ... reserved by running sequences
    prefix_cache: bool             # a prefix store is kept (dense targets, unless --disable-radix-cache)
    prefix_hit_rate: float         # share of prompt tokens copied from it
    memory: dict                   # measured bytes: weights, kv_cache, state_cache, prefix_cache (serving.memory)
    kernels: dict                  # which implementation runs each part of the target
    max_sequence_tokens: int | None = None   # prompt + max_tokens one sequence can hold; None: no bound


@dataclass(frozen=True)
class Snapshot:
    """The engine's figures at one moment: the runner's, and its queue (serving.engine.Engine.snapshot)."""

    info: RunnerInfo
    running: int                   # sequences in flight
    queued: int                    # requests waiting for admission
    max_running: int
    pid: int                       # the process the engine runs in (kill -USR1 PID: its threads' stacks)


class Runner(Protocol):
    max_running: int               # most sequences in flight

    def fits(self, prompt_tokens: int, max_new_tokens: int) -> bool:
        """The request can ever be admitted (prompt + max_tokens + verify rows fit the pool)."""

    def admit(self, seq) -> bool:
        """Reserve what the sequence needs; False: not now (it waits)."""

    def prefill(self, seqs, chunk: int) -> list[list[int]]:
        """Each sequence's next prompt chunk, one pass for all; [first token] once its prompt is read."""

    def decode(self, seqs) -> list[list[int]]:
        """One round for every decoding sequence: its committed tokens."""

    def release(self, seq) -> None:
        """Free the sequence's rows (finished, cancelled or failed)."""

    def info(self) -> RunnerInfo: ...
