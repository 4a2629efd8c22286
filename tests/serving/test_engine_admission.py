"""Fair admission: queued requests that fit pass a head that does not, a bounded number of times.

A runner with a row budget and no model work (tests/serving/fake_runner.py) stands in for the
batch runner's pool; the real pool's reservations are tested in test_batching.py. Each request
reserves prompt + max_tokens rows for its whole life, as the batch runner's admission does.
The assertions are about order (which request finishes first), never about time.
"""

from __future__ import annotations

import queue
import threading

from serving.engine import engine as engine_module
from serving.engine import Engine, Finished, GenerationRequest, StopRule
from serving.sampling import SamplingParams
from tests.serving.fake_runner import FakeRunner

GREEDY = SamplingParams(temperature=0)


class Rows(FakeRunner):
    """`rows` pool rows; the first prefill waits for `go` (so the queue fills behind it)."""

    max_running = 8

    def __init__(self, rows: int):
        self.free, self.go = rows, threading.Event()

    def admit(self, seq) -> bool:
        need = len(seq.prompt) + seq.request.rule.max_new_tokens
        if need > self.free:
            return False
        self.free -= need
        return True

    def release(self, seq) -> None:
        self.free += len(seq.prompt) + seq.request.rule.max_new_tokens

    def start(self, prompt_ids, sampling, max_new_tokens):
        self.go.wait(timeout=10)
        return [1]

    def step(self):
        return [2]


def finish_order(runner: Rows, lengths: list[int]) -> list[int]:
    """Submit one request per max_tokens in `lengths` (prompt of 1) behind a first one that
    blocks the worker until all are queued; the indices in the order they finish."""
    engine = Engine(lambda: runner, tokenizer=NoText(), max_queued=16).start()
    done: queue.Queue = queue.Queue()
    try:
        for i, n in enumerate(lengths):
            engine.submit(GenerationRequest([5], GREEDY, StopRule(n),
                                            lambda e, i=i: done.put(i) if isinstance(e, Finished) else None))
            if i == 0:
                while engine.running == 0:      # the first is admitted and holds the worker
                    threading.Event().wait(0.001)
        runner.go.set()
        return [done.get(timeout=30) for _ in lengths]
    finally:
        engine.stop()


class NoText:
    @staticmethod
    def decode(ids) -> str:
        return ""


def test_a_short_request_passes_a_long_one_that_does_not_fit_yet():
    # 100 rows: the first long request (81) runs, the second (81) cannot; the short one (5) can
    assert finish_order(Rows(100), [80, 80, 4]) == [2, 0, 1]


def test_passing_is_bounded_so_the_waiting_head_is_not_starved(monkeypatch):
    assert finish_order(Rows(100), [80, 80, 4, 4]) == [2, 3, 0, 1]      # both short ones pass
    monkeypatch.setattr(engine_module, "PASSES", 1)
    # one short request passes the waiting long one; the next waits until the long one is in
    assert finish_order(Rows(100), [80, 80, 4, 4]) == [2, 0, 3, 1]


def test_without_a_waiting_head_requests_are_admitted_in_order():
    assert finish_order(Rows(1000), [30, 20, 10]) == [2, 1, 0]
