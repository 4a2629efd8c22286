"""Request heads that could be read two ways: the checks `connections.StrictConnection` runs
on the raw bytes of each head before h11 parses it. Pure, no I/O.

RFC 9112 section 6.3: a request with both Transfer-Encoding and Content-Length "ought to be
handled as an error" and the connection closed after responding; repeated or list-valued
Content-Length is invalid framing (a recipient that merges equal values reads it one way, a
proxy that takes the first or last another); obs-fold (a header line starting with a space or
tab) must be rejected or replaced, and h11 joins it into the previous value, so a line such as
" Transfer-Encoding: chunked" reads as a header to one parser and as text to the other. Only
HTTP/1.0 and HTTP/1.1 are read as HTTP/1.x. A head larger than MAX_HEAD_BYTES is refused
whether it arrives in one read or in many (h11 bounds only a head still incomplete).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import unquote

MAX_HEAD_BYTES = 16384          # h11's own bound on an incomplete head (DEFAULT_MAX_INCOMPLETE_EVENT_SIZE)
VERSIONS = (b"HTTP/1.0", b"HTTP/1.1")
BLANK_LINE = re.compile(b"\n\r?\n")     # where h11 ends a head
FRAMING_ERROR = "ddops.framing_error"   # ASGI scope key: why h11 refused this request's body


@dataclass(frozen=True)
class Refusal:
    reason: str
    path: str = "other"         # the request's path when its request line reads, for the counter


def refusal(start: bytes, buffered: int) -> Refusal | None:
    """Why the head at the start of `start` (the first bytes of a receive buffer of `buffered`
    bytes) must be refused, or None: fine, or not complete yet and still within the bound."""
    end = BLANK_LINE.search(start)
    if end is None:
        if buffered > MAX_HEAD_BYTES:
            return Refusal(f"request head exceeds {MAX_HEAD_BYTES} bytes")
        return None
    if end.start() > MAX_HEAD_BYTES:
        return Refusal(f"request head exceeds {MAX_HEAD_BYTES} bytes")
    lines = [line.rstrip(b"\r") for line in start[:end.start()].lstrip(b"\r\n").split(b"\n")]
    path = _path(lines[0])
    problem = _version(lines[0]) or _fields(lines[1:])
    return None if problem is None else Refusal(problem, path)


def _path(request_line: bytes) -> str:
    parts = request_line.split(b" ")
    try:
        return unquote(parts[1].partition(b"?")[0].decode("ascii")) if len(parts) == 3 else "other"
    except UnicodeDecodeError:
        return "other"


def _version(request_line: bytes) -> str | None:
    version = request_line.rsplit(b" ", 1)[-1]
    if version.startswith(b"HTTP/") and version not in VERSIONS:
        return f"unsupported HTTP version {version.decode('ascii', 'replace')} (this server speaks HTTP/1.1)"
    return None


def _fields(lines: list[bytes]) -> str | None:
    lengths = encodings = 0
    for line in lines:
        if line[:1] in (b" ", b"\t"):
            return "obsolete header line folding (a line starting with whitespace)"
        name, _, value = line.partition(b":")
        name = name.lower()
        if name == b"content-length":
            lengths += 1
            if b"," in value:
                return "Content-Length holds a list of values"
        elif name == b"transfer-encoding":
            encodings += 1
    if lengths > 1:
        return "more than one Content-Length header"
    if lengths and encodings:
        return "both Content-Length and Transfer-Encoding (the body's length could be read two ways)"
    return None
