"""uvicorn's HTTP/1.1 protocol with read deadlines: a slow or silent client loses its connection.

uvicorn closes idle keep-alive connections (--timeout-keep-alive) but waits forever for a
request that arrives a byte at a time (slowloris): each such connection holds a file
descriptor. Here a request's headers must be complete within `headers_s` of the connection
opening (or of the previous response ending), and its body within `body_s` of the headers.
While the application is answering, no deadline runs.
"""

from __future__ import annotations

import resource
import time

from uvicorn.protocols.http.h11_impl import H11Protocol


def guarded_protocol(headers_s: float, body_s: float) -> type:
    """An H11Protocol class (uvicorn.Config(http=...)) with these read deadlines in seconds."""
    return type("GuardedH11Protocol", (_Guarded,), {"headers_s": headers_s, "body_s": body_s})


class _Guarded(H11Protocol):
    headers_s = 10.0
    body_s = 30.0

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self._timer = None
        self._seen_cycle = None
        self._headers_began = self._body_began = time.monotonic()
        self._schedule()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        self._note_cycle()
        self._schedule()

    def on_response_complete(self) -> None:
        self._headers_began = time.monotonic()    # the next request's headers are due from now
        super().on_response_complete()
        self._note_cycle()
        self._schedule()

    def connection_lost(self, exc) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        super().connection_lost(exc)

    def _note_cycle(self) -> None:
        if self.cycle is not self._seen_cycle:   # new request: its headers are in, its body is due
            self._seen_cycle, self._body_began = self.cycle, time.monotonic()

    def _phase(self) -> str | None:
        cycle = self.cycle
        if cycle is None or cycle.response_complete:
            return "headers"
        return "body" if cycle.more_body else None   # None: the application is answering

    def _left(self) -> float | None:
        phase = self._phase()
        if phase is None:
            return None
        if phase == "headers":
            return self._headers_began + self.headers_s - time.monotonic()
        return self._body_began + self.body_s - time.monotonic()

    def _schedule(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if not self.transport.is_closing():
            left = self._left()
            if left is not None:
                self._timer = self.loop.call_later(max(left, 0.0), self._check)

    def _check(self) -> None:
        self._timer = None
        self._note_cycle()
        left = self._left()
        if left is not None and left <= 0 and not self.transport.is_closing():
            self.transport.close()
            return
        self._schedule()


def raise_open_files_limit() -> int:
    """Soft RLIMIT_NOFILE up to the hard limit, so many idle clients cannot exhaust descriptors."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        return hard
    return soft
