"""Engine: a bounded request queue and one worker thread that runs one sequence at a time.

Requests carry an `emit` callback, called from the worker thread with `Delta` events and
exactly one final `Finished` (or `Failed`). The server bridges those into asyncio; tests can
use `Engine.generate` which blocks.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

from serving.engine.stats import EngineStats, Usage
from serving.engine.stops import StopRule, TextAssembler
from serving.sampling import SamplingParams

log = logging.getLogger("serving.engine")


class EngineBusy(RuntimeError):
    """The request queue is full (--max-running-requests)."""


@dataclass(frozen=True)
class Delta:
    text: str
    token_ids: tuple[int, ...]


@dataclass(frozen=True)
class Finished:
    text: str
    token_ids: tuple[int, ...]
    finish_reason: str
    usage: Usage


@dataclass(frozen=True)
class Failed:
    message: str


@dataclass
class GenerationRequest:
    prompt_ids: list[int]
    sampling: SamplingParams
    rule: StopRule
    emit: Callable[[object], None]
    cancelled: threading.Event = field(default_factory=threading.Event)


class Engine:
    def __init__(self, decoder_factory: Callable[[], object], tokenizer, max_queued: int = 256):
        self.decoder_factory = decoder_factory
        self.tokenizer = tokenizer
        self.stats = EngineStats()
        self.queue: queue.Queue = queue.Queue(maxsize=max_queued)
        self.worker = threading.Thread(target=self._work, name="engine-worker", daemon=True)
        self.decoder = None

    def start(self) -> "Engine":
        self.decoder = self.decoder_factory()
        self.worker.start()
        return self

    def stop(self) -> None:
        self.queue.put(None)
        self.worker.join(timeout=10)

    def submit(self, request: GenerationRequest) -> None:
        try:
            self.queue.put_nowait(request)
        except queue.Full:
            raise EngineBusy(f"request queue full ({self.queue.maxsize} waiting)") from None

    def generate(self, prompt_ids, sampling: SamplingParams, rule: StopRule, timeout: float = 120.0):
        """Blocking helper: the `Finished` (or `Failed`) event of one request."""
        done = queue.Queue()
        self.submit(GenerationRequest(prompt_ids, sampling, rule,
                                      lambda e: done.put(e) if not isinstance(e, Delta) else None))
        return done.get(timeout=timeout)

    def _work(self) -> None:
        while (request := self.queue.get()) is not None:
            if request.cancelled.is_set():
                continue
            try:
                _deliver(request, self._run(request))
            except Exception as e:  # one bad request must not take the worker down
                log.exception("generation failed")
                _deliver(request, Failed(f"generation failed: {e}"))

    def _run(self, request: GenerationRequest) -> Finished:
        began = time.perf_counter()
        text = TextAssembler(request.rule, self.tokenizer.decode)
        tokens = self.decoder.start(request.prompt_ids, request.sampling, request.rule.max_new_tokens)
        ttft = time.perf_counter() - began
        rounds = accepted = 0
        self._emit_delta(request, text, tokens)
        while not text.finish_reason and not request.cancelled.is_set():
            tokens = self.decoder.step()
            rounds, accepted = rounds + 1, accepted + self.decoder.last_accept_length
            self._emit_delta(request, text, tokens)
        usage = Usage(len(request.prompt_ids), len(text.ids), rounds, accepted,
                      ttft, time.perf_counter() - began)
        self.stats.record(usage)
        return Finished(text.text, tuple(text.ids), text.finish_reason or "abort", usage)

    @staticmethod
    def _emit_delta(request, text: TextAssembler, tokens: list[int]) -> None:
        before = len(text.ids)
        delta = text.feed(tokens)
        if delta:
            _deliver(request, Delta(delta, tuple(text.ids[before:])))


def _deliver(request: GenerationRequest, event) -> None:
    try:
        request.emit(event)
    except Exception:  # the listener is gone (closed event loop): stop generating for it
        log.debug("dropping event for a request nobody listens to", exc_info=True)
        request.cancelled.set()
