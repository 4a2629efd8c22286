"""Bridge one generation between the engine's worker thread and an HTTP request.

`Admitted` submits at once, so a full queue is a 503 before any response (or stream) starts,
and watches the client's connection: when it goes away the generation is cancelled, whether
it is still queued, running, or streaming. `HealthProbe` runs /health_generate's probe at most
once at a time and shares a short-lived result, so probes can never crowd out real requests.
"""

from __future__ import annotations

import asyncio
import time
from typing import AsyncIterator, Awaitable, Callable

from starlette.requests import ClientDisconnect

from serving.engine import Delta, EngineBusy, Failed, Finished, GenerationRequest, RequestTooLarge, StopRule
from serving.sampling import SamplingParams
from serving.server.protocol import APIError

Receive = Callable[[], Awaitable[dict]]
RETRY_AFTER_S = 1
GONE = object()              # queued when the client disconnects


class ClientGone(ClientDisconnect):
    """The client closed its connection before the answer was complete."""


class Admitted:
    """One submitted GenerationRequest, its asyncio event queue and a watch on the client."""

    def __init__(self, engine, prompt_ids: list[int], sampling: SamplingParams, rule: StopRule,
                 receive: Receive | None = None, probe: bool = False, arrival: float | None = None,
                 record: Callable[[Finished], None] | None = None):
        """arrival: perf_counter() when the HTTP request arrived (TTFT counts from it); None: now.
        record: called with the `Finished` event whether or not anyone still listens, so a
        generation the client abandoned is counted too (its tokens were computed)."""
        loop = asyncio.get_running_loop()
        self.events: asyncio.Queue = asyncio.Queue()
        self.record = record
        self.request = GenerationRequest(prompt_ids, sampling, rule,
                                         lambda e: loop.call_soon_threadsafe(self._arrived, e),
                                         probe=probe)
        if arrival is not None:
            self.request.submitted = arrival
        try:
            engine.submit(self.request)
        except EngineBusy as e:
            raise APIError(503, f"server busy: {e}; retry later", code="server_busy", kind="server_error",
                           retry_after=RETRY_AFTER_S) from None
        except RequestTooLarge as e:
            raise APIError(400, str(e), "max_tokens", "context_length_exceeded") from None
        self.watch = asyncio.ensure_future(self._watch(receive)) if receive else None

    def _arrived(self, event) -> None:
        if self.record is not None and isinstance(event, Finished):
            self.record(event)
        self.events.put_nowait(event)

    async def _watch(self, receive: Receive) -> None:
        # the body is read already, so receive() only returns at http.disconnect (or once the
        # response is complete, when cancelling is a no-op)
        while (await receive())["type"] != "http.disconnect":
            pass
        self.request.cancelled.set()
        self.events.put_nowait(GONE)

    async def next_event(self):
        event = await self.events.get()
        if event is GONE:
            raise ClientGone()
        return event

    def close(self) -> None:
        if self.watch is not None:
            self.watch.cancel()
        self.request.cancelled.set()      # a no-op when finished; stops the worker if we gave up

    async def result(self, timeout: float | None = None) -> Finished:
        """The final event; raises APIError on a failed generation, ClientGone on a disconnect."""
        try:
            async with asyncio.timeout(timeout):
                while isinstance(event := await self.next_event(), Delta):
                    pass
        finally:
            self.close()
        if isinstance(event, Failed):
            raise APIError(500, event.message, code="generation_failed", kind="server_error")
        return event

    async def deltas(self) -> AsyncIterator[Delta | Finished | Failed]:
        """Every event up to and including the final one; closes on exit, however it exits."""
        try:
            while isinstance(event := await self.next_event(), Delta):
                yield event
            yield event
        finally:
            self.close()


class HealthProbe:
    """/health_generate's generation: one at a time, at most one per `interval_s`.

    A caller shares the probe in flight, or waits for the next one, which starts `interval_s`
    after the last ended: every answer is at most one probe old, and any number of callers,
    keyed or not, costs the engine at most one short generation per interval (and a client
    looping on the endpoint gets one answer per interval, not one per round trip).
    """

    def __init__(self, run: Callable[[], Awaitable[dict]], interval_s: float):
        self.run, self.interval_s = run, interval_s
        self.task: asyncio.Task | None = None
        self.done_at = float("-inf")

    async def outcome(self) -> tuple[int, dict]:
        if self.task is None or self.task.done():
            wait = self.done_at + self.interval_s - time.monotonic()
            self.task = asyncio.ensure_future(self._probe(max(wait, 0.0)))
        # shield: a caller that disconnects must not cancel the probe others wait on
        return await asyncio.shield(self.task)

    async def _probe(self, delay_s: float) -> tuple[int, dict]:
        await asyncio.sleep(delay_s)
        try:
            return 200, await self.run()
        except (asyncio.TimeoutError, APIError, RuntimeError) as e:
            return 503, {"status": "unhealthy", "reason": str(e) or "timeout"}
        finally:
            self.done_at = time.monotonic()
