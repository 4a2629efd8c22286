"""The engine in a process of its own, behind the same interface the server uses.

In one process, the HTTP side and the engine's worker share one interpreter lock. Every torch
op of a decode step lets go of it and takes it back, so while the event loop parses request
after request the engine waits for it op by op: 8 clients sending bodies the server refuses
held a normal request of the tiny model at 2.1x its time alone on 2 CPUs, at 0.9 ms of the
server's CPU per refusal (`python -m serving.bench.hostile`). vLLM (its engine core process)
and SGLang (its scheduler process) keep the model apart from the HTTP server for the same
reason.

`EngineProcess` starts `build` (a picklable zero-argument callable returning a started
`Engine`) in a spawned child and speaks to it over one pipe:

    parent -> child   ("submit", id, GenerationRequest without its listener: emit, cancelled)
                      ("cancel", id)  ("snapshot", call)  ("stop",)
    child -> parent   ("ready", Snapshot) or ("failed", message) once, then
                      ("event", id, Delta | Finished | Failed)  ("snapshot", call, Snapshot)

Admission is the parent's alone, so a refusal is still an exception at `submit`: the largest
sequence the runner can hold (`RunnerInfo.max_sequence_tokens`, the runner's `fits`) and the
number of requests in flight (queued plus running); the child queues what it is sent.
`perf_counter` is the system's monotonic clock on Linux, so a request's arrival time means the
same on both sides. The child ignores SIGINT and SIGTERM, so a server's graceful shutdown lets
running requests finish; it exits when the parent says stop or its end of the pipe closes (the
parent died). If the child dies, every request in flight fails and `on_exit` is called (the
server stops: systemd restarts it).
"""

from __future__ import annotations

import faulthandler
import itertools
import logging
import multiprocessing
import os
import queue
import signal
import threading
from dataclasses import replace
from typing import Callable

from serving.engine.engine import EngineBusy, GenerationRequest, RequestTooLarge, deliver
from serving.engine.events import Failed, Finished
from serving.engine.runner import Snapshot
from serving.engine.stats import EngineStats

log = logging.getLogger("serving.engine")
SNAPSHOT_TIMEOUT_S = 10.0
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"   # the server's (serving.server.startup)


class EngineProcess:
    def __init__(self, build: Callable, max_queued: int = 256, on_exit: Callable[[], None] = lambda: None):
        self.build, self.max_queued, self.on_exit = build, max_queued, on_exit
        self.stats = EngineStats()
        self.requests: dict[int, GenerationRequest] = {}
        self.replies: dict[int, queue.Queue] = {}
        self.ids = itertools.count()
        self.lock = threading.Lock()          # the registry (requests in flight)
        self.writing = threading.Lock()       # one writer on the pipe at a time; never held with `lock`,
        # so the receiver, which takes only `lock`, keeps reading while a send waits on a full pipe
        self.stopping = False

    def start(self) -> "EngineProcess":
        """Spawn the child and wait until its engine is built; raises RuntimeError when it fails."""
        context = multiprocessing.get_context("spawn")
        self.conn, child_end = context.Pipe()
        logging_setup = (logging.getLogger().level, LOG_FORMAT)
        self.process = context.Process(target=_child, args=(child_end, self.build, logging_setup),
                                       name="serving-engine", daemon=True)
        self.process.start()
        child_end.close()
        try:
            first = self.conn.recv()
        except EOFError:
            self.process.join(5)
            raise RuntimeError(f"the engine process exited while loading (exit code {self.process.exitcode})") from None
        if first[0] == "failed":
            self.process.join(5)
            raise RuntimeError(first[1])
        self.limits: Snapshot = first[1]      # what admission needs: fixed once the runner is built
        self.receiver = threading.Thread(target=self._receive, name="engine-events", daemon=True)
        self.receiver.start()
        return self

    def stop(self) -> None:
        self.stopping = True
        try:
            self._send(("stop",))
        except OSError:
            pass
        self.process.join(10)
        if self.process.is_alive():
            self.process.kill()

    def submit(self, request: GenerationRequest) -> None:
        cap = self.limits.info.max_sequence_tokens
        if cap is not None and len(request.prompt_ids) + request.rule.max_new_tokens > cap:
            raise RequestTooLarge.of(request)
        with self.lock:
            if len(self.requests) >= self.max_queued + self.limits.max_running:
                raise EngineBusy(f"request queue full ({self.max_queued} waiting)")
            key = next(self.ids)
            self.requests[key] = request
        already = request.cancelled.is_set()
        request.cancelled = _Cancel(lambda: self._cancel(key))
        self._send(("submit", key, replace(request, emit=None, cancelled=None)))   # its listener stays here
        if already:
            request.cancelled.set()

    def snapshot(self) -> Snapshot:
        """The child's figures now (a round trip; the worker answers between ops, not steps)."""
        call, reply = next(self.ids), queue.Queue(maxsize=1)
        self.replies[call] = reply
        try:
            self._send(("snapshot", call))
            return reply.get(timeout=SNAPSHOT_TIMEOUT_S)
        finally:
            self.replies.pop(call, None)

    def _cancel(self, key: int) -> None:
        if key in self.requests:
            try:
                self._send(("cancel", key))
            except OSError:
                pass

    def _send(self, message: tuple) -> None:
        with self.writing:
            self.conn.send(message)

    def _receive(self) -> None:
        try:
            while True:
                message = self.conn.recv()
                if message[0] == "event":
                    self._arrived(message[1], message[2])
                elif message[0] == "snapshot" and message[1] in self.replies:
                    self.replies[message[1]].put(message[2])
        except (EOFError, OSError):
            pass
        with self.lock:
            orphans, self.requests = list(self.requests.values()), {}
        for request in orphans:
            deliver(request, Failed("the engine process exited"))
        if not self.stopping:
            self.process.join(5)
            log.error("the engine process exited (exit code %s)", self.process.exitcode)
            self.on_exit()

    def _arrived(self, key: int, event) -> None:
        final = isinstance(event, (Finished, Failed))
        with self.lock:
            request = self.requests.pop(key, None) if final else self.requests.get(key)
        if request is None:
            return
        if isinstance(event, Finished):
            self.stats.record(event.usage)
        deliver(request, event)


class _Cancel(threading.Event):
    """A request's `cancelled` flag whose first `set` also tells the child."""

    def __init__(self, forward: Callable[[], None]):
        super().__init__()
        self.forward = forward

    def set(self) -> None:
        if not self.is_set():
            super().set()
            self.forward()


def _child(conn, build: Callable, logging_setup: tuple[int, str]) -> None:
    """The child: build the engine, then serve the parent's messages until stop or EOF."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    faulthandler.register(signal.SIGUSR1, all_threads=True)   # kill -USR1 CHILD: the engine's stacks
    logging.basicConfig(level=logging_setup[0], format=logging_setup[1])
    try:
        engine = build()
    except Exception as e:   # noqa: BLE001 (any load failure is reported as one line)
        log.debug("engine build failed", exc_info=True)
        conn.send(("failed", str(e) or type(e).__name__))
        return
    lock = threading.Lock()
    cancels: dict[int, threading.Event] = {}

    def send(message: tuple) -> None:
        with lock:
            conn.send(message)

    def emitter(key: int):
        def emit(event) -> None:
            if isinstance(event, (Finished, Failed)):
                cancels.pop(key, None)
            send(("event", key, event))
        return emit

    send(("ready", engine.snapshot()))
    try:
        while True:
            message = conn.recv()
            kind = message[0]
            if kind == "submit":
                key, sent = message[1:]
                cancels[key] = threading.Event()
                engine.enqueue(replace(sent, emit=emitter(key), cancelled=cancels[key]))
            elif kind == "cancel":
                event = cancels.get(message[1])
                if event is not None:
                    event.set()
            elif kind == "snapshot":
                send(("snapshot", message[1], engine.snapshot()))
            elif kind == "stop":
                break
    except (EOFError, OSError):
        pass
    engine.stop()
    os._exit(0)
