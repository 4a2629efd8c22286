"""uvicorn's HTTP/1.1 protocol with read deadlines and one reading of every request's framing.

Deadlines: uvicorn closes idle keep-alive connections (--timeout-keep-alive) but waits forever
for a request that arrives a byte at a time (slowloris): each such connection holds a file
descriptor. Here a request's headers must be complete within `headers_s` of the connection
opening (or of the previous response ending), and its body within `body_s` of the headers.
While the application is answering, no deadline runs.

Framing: a request that two HTTP parsers could read two ways (a proxy in front of us and h11
here) is refused with a JSON 400 and the connection closed, so no bytes after it are ever
served as a second request (request smuggling). h11 alone reads Content-Length together with
Transfer-Encoding as chunked, merges repeated equal lengths, folds obsolete continuation lines,
takes any `HTTP/d.d` as HTTP/1.1, and bounds a header block only while it is incomplete;
`serving.server.request_heads` checks each head before h11 parses it.
"""

from __future__ import annotations

import json
import resource
import time

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from serving.server.request_heads import FRAMING_ERROR, MAX_HEAD_BYTES, refusal


def guarded_protocol(headers_s: float, body_s: float, count=None) -> type:
    """An H11Protocol class (uvicorn.Config(http=...)) with these read deadlines in seconds;
    count(path, 400) is called for each request refused for its framing before it reached the app."""
    return type("GuardedH11Protocol", (_Guarded,), {"headers_s": headers_s, "body_s": body_s,
                                                    "count": staticmethod(count or (lambda path, status: None))})


class StrictConnection(h11.Connection):
    """h11's server side, refusing a request head that `request_heads.refusal` finds ambiguous.

    Checked on the raw bytes, where h11 has not yet merged or dropped anything, and only when
    h11 waits for a request head (their state IDLE), so bodies and pipelining are h11's alone.
    """

    refused_path = "other"     # the refused head's path, when its request line could be read
    last_error = ""

    def next_event(self):
        try:
            return super().next_event()
        except h11.RemoteProtocolError as e:     # uvicorn drops the reason; the 400 names it
            self.last_error = str(e)
            raise

    def _extract_next_receive_event(self):
        if self.their_state is h11.IDLE and self._receive_buffer:
            # a bounded copy: a head never needs more, whatever body came in the same read
            problem = refusal(bytes(self._receive_buffer._data[:MAX_HEAD_BYTES + 4]), len(self._receive_buffer))
            if problem is not None:
                self.refused_path = problem.path
                raise h11.RemoteProtocolError(problem.reason, error_status_hint=400)
        return super()._extract_next_receive_event()


class _Guarded(H11Protocol):
    headers_s = 10.0
    body_s = 30.0

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.conn = StrictConnection(h11.SERVER, MAX_HEAD_BYTES)

    def send_400_response(self, msg: str) -> None:
        """uvicorn calls this for any h11 RemoteProtocolError: answer JSON, count it, close."""
        reason = self.conn.last_error or msg
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete:
            cycle.scope[FRAMING_ERROR] = reason      # the app is reading its body: it counts the 400
            cycle.disconnected = True                # its receive() now says so, its send() is dropped
            cycle.message_event.set()
        else:
            self.count(self.conn.refused_path, 400)
        if self.conn.our_state in (h11.IDLE, h11.SEND_RESPONSE):
            body = json.dumps({"error": {"message": f"malformed HTTP request: {reason}",
                                         "type": "invalid_request_error", "param": None,
                                         "code": "invalid_http"}}).encode()
            headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body)),
                       (b"connection", b"close")]
            for event in (h11.Response(status_code=400, headers=headers, reason=b"Bad Request"),
                          h11.Data(data=body), h11.EndOfMessage()):
                self.transport.write(self.conn.send(event))
        self.transport.close()

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
