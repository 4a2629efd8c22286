"""Engine: a bounded request queue and one worker thread that keeps many sequences in flight.

Requests carry an `emit` callback, called from the worker thread with `Delta` events and
exactly one final `Finished` (or `Failed`). The server bridges those into asyncio; tests can
use `Engine.generate` which blocks.

The worker admits queued requests FIFO while the runner has room (running sequences and KV
rows, serving.engine.scheduler), then runs one scheduler step; a full queue refuses new ones
with `EngineBusy`. A request that does not fit yet waits at the head of the queue, and queued
requests that fit now pass it (a long generation holding most rows must not hold up short
ones behind a second long one), at most `PASSES` per head, after which nothing passes until
the head is in (a stream of short requests cannot starve a long one either). The
runner factory returns the batch runner (serving.engine.batch); the server reads the engine
through `snapshot()`, never the runner itself (serving.engine.process runs it in a child process).
"""

from __future__ import annotations

import logging
import os
import queue
import threading
from typing import Callable

from serving.engine.events import Delta, Failed, Finished, GenerationRequest
from serving.engine.runner import Runner, RunnerInfo, Snapshot
from serving.engine.scheduler import Scheduler
from serving.engine.stats import EngineStats
from serving.engine.stops import StopRule
from serving.sampling import SamplingParams

log = logging.getLogger("serving.engine")
STOP = object()
PASSES = 32  # queued requests admitted past a waiting head before it must go first

__all__ = ["Delta", "Engine", "EngineBusy", "Failed", "Finished", "GenerationRequest", "RequestTooLarge", "deliver",
           "run_alone"]


class EngineBusy(RuntimeError):
    """The request queue is full."""


class RequestTooLarge(ValueError):
    """prompt + max_tokens can never fit the KV pool (--max-total-tokens)."""

    @classmethod
    def of(cls, request) -> "RequestTooLarge":
        return cls(f"prompt ({len(request.prompt_ids)} tokens) + max_tokens "
                   f"({request.rule.max_new_tokens}) exceeds the KV pool")


class Engine:
    def __init__(self, runner_factory: Callable[[], Runner], tokenizer, max_queued: int = 256,
                 chunk_tokens: int = 512):
        self.runner_factory = runner_factory
        self.tokenizer = tokenizer
        self.chunk_tokens = chunk_tokens
        self.stats = EngineStats()
        self.queue: queue.Queue = queue.Queue(maxsize=max_queued)
        self.worker = threading.Thread(target=self._work, name="engine-worker", daemon=True)
        self.runner: Runner | None = None
        self.scheduler: Scheduler | None = None
        self.passed = 0     # requests admitted past the waiting head

    def start(self) -> "Engine":
        self.runner = self.runner_factory()
        self.scheduler = Scheduler(self.runner, self.tokenizer, deliver, self.stats.record, self.chunk_tokens)
        self.worker.start()
        return self

    def stop(self) -> None:
        self.queue.put(STOP)
        self.worker.join(timeout=10)

    @property
    def running(self) -> int:
        return len(self.scheduler.running) if self.scheduler else 0

    def info(self) -> RunnerInfo:
        """The runner's figures (speculative settings, KV use, prefix cache, memory, kernels)."""
        return self.runner.info()

    def snapshot(self) -> Snapshot:
        return Snapshot(self.info(), self.running, self.queue.qsize(), self.runner.max_running, os.getpid())

    def submit(self, request: GenerationRequest) -> None:
        """Admit `request`: RequestTooLarge if it can never fit, EngineBusy while the queue is full."""
        if self.runner is not None and not self.runner.fits(len(request.prompt_ids), request.rule.max_new_tokens):
            raise RequestTooLarge.of(request)
        try:
            self.queue.put_nowait(request)
        except queue.Full:
            raise EngineBusy(f"request queue full ({self.queue.maxsize} waiting)") from None

    def enqueue(self, request: GenerationRequest) -> None:
        """Queue a request admitted already: the engine process's parent admits with the same
        limits (serving.engine.process), and this engine's queue then has no bound of its own."""
        self.queue.put(request)

    def generate(self, prompt_ids, sampling: SamplingParams, rule: StopRule, timeout: float = 120.0):
        """Blocking helper: the `Finished` (or `Failed`) event of one request."""
        done = queue.Queue()
        self.submit(GenerationRequest(prompt_ids, sampling, rule,
                                      lambda e: done.put(e) if not isinstance(e, Delta) else None))
        return done.get(timeout=timeout)

    def _work(self) -> None:
        head = None
        while True:
            if head is None and not self.scheduler.running:
                head = self.queue.get()
            head = self._admit(head)
            if head is STOP:
                return
            if self.scheduler.running:
                self.scheduler.step()
            elif head is not None:      # nothing runs and it still does not fit: it never will
                deliver(head, Failed("the request does not fit the KV pool"))
                head = None

    def _admit(self, head):
        """Admit queued requests FIFO; returns the one that must wait (or STOP, or None)."""
        while True:
            if head is None:
                if len(self.scheduler.running) >= self.runner.max_running:
                    return None
                try:
                    head = self.queue.get_nowait()
                except queue.Empty:
                    return None
            if head is STOP:
                return STOP
            if not head.cancelled.is_set() and not self.scheduler.admit(head, head.submitted):
                self._pass(head)
                return head
            head, self.passed = None, 0

    def _pass(self, head: GenerationRequest) -> None:
        """Admit queued requests that fit now past `head`, which does not, up to PASSES in all."""
        with self.queue.mutex:
            for request in list(self.queue.queue):
                if self.passed >= PASSES or len(self.scheduler.running) >= self.runner.max_running:
                    break
                if request is STOP or request.cancelled.is_set():
                    continue
                if self.scheduler.admit(request, request.submitted):
                    self.queue.queue.remove(request)
                    self.queue.not_full.notify()
                    self.passed += 1


class _NoText:
    @staticmethod
    def decode(ids) -> str:
        return ""


def run_alone(runner: Runner, prompt_ids: list[int], sampling: SamplingParams, rule: StopRule, tokenizer=None):
    """One request through a runner on this thread, no worker or queue (tools, benchmarks and
    tests that time or inspect the runner itself): its `Finished` (or `Failed`) event. Without
    a tokenizer the text stays empty and stop strings never match."""
    events: list = []
    request = GenerationRequest(prompt_ids, sampling, rule, events.append)
    scheduler = Scheduler(runner, tokenizer or _NoText, deliver, lambda usage: None)
    if not scheduler.admit(request, request.submitted):
        raise RequestTooLarge(f"prompt ({len(prompt_ids)} tokens) + max_tokens ({rule.max_new_tokens}) "
                              "does not fit the runner's pool")
    while scheduler.running:
        scheduler.step()
    return events[-1]


def deliver(request: GenerationRequest, event) -> None:
    """Hand `event` to the request's listener, on either side of the process boundary
    (serving.engine.process: there, cancelling also tells the engine's process)."""
    try:
        request.emit(event)
    except Exception:  # the listener is gone (closed event loop, closed pipe): stop generating for it
        log.debug("dropping event for a request nobody listens to", exc_info=True)
        request.cancelled.set()
