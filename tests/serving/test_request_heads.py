"""Request heads two parsers could read two ways are refused (issue 26), as a table over the
pure check; tests/serving/test_hostile_http.py sends the same heads to a real server."""

from __future__ import annotations

import pytest

from serving.server.request_heads import MAX_HEAD_BYTES, refusal

POST = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"


def head(*lines: bytes, start: bytes = POST) -> bytes:
    return start + b"".join(line + b"\r\n" for line in lines) + b"\r\n"


@pytest.mark.parametrize("raw,reason", [
    (head(b"Content-Length: 5", b"Transfer-Encoding: chunked"), "both Content-Length and Transfer-Encoding"),
    (head(b"Transfer-Encoding: chunked", b"content-length: 5"), "both Content-Length and Transfer-Encoding"),
    (head(b"Content-Length: 5", b"Content-Length: 5"), "more than one Content-Length"),
    (head(b"Content-Length: 5, 5"), "list of values"),
    (head(b"X-A: 1", b" Transfer-Encoding: chunked"), "folding"),
    (head(b"X-A: 1", b"\tContent-Length: 5"), "folding"),
    (head(start=b"GET /health HTTP/1.9\r\n"), "HTTP/1.9"),
    (head(start=b"GET /health HTTP/2.0\r\n"), "HTTP/2.0"),
    (head(*(b"X-H%d: %s" % (i, b"a" * 30) for i in range(1000))), f"exceeds {MAX_HEAD_BYTES}"),
])
def test_ambiguous_heads_are_refused_with_a_reason(raw, reason):
    found = refusal(raw[:MAX_HEAD_BYTES + 4], len(raw))
    assert found is not None and reason in found.reason


def test_a_refused_head_names_its_path_for_the_counter():
    assert refusal(head(b"Content-Length: 1", b"Content-Length: 1"), 99).path == "/v1/completions"
    assert refusal(head(start=b"GET /health?x=1 HTTP/2.0\r\n"), 99).path == "/health"


@pytest.mark.parametrize("raw", [
    head(b"Content-Length: 5"),
    head(b"Transfer-Encoding: chunked"),
    head(start=b"GET /health HTTP/1.0\r\n"),
    head(b"X-Content-Length: 5", b"Content-Length: 5"),
    head(b"Authorization: Bearer k") + b'{"prompt": "Content-Length: 5\r\n"}',   # the body is not the head
])
def test_plain_heads_pass(raw):
    assert refusal(raw, len(raw)) is None


def test_an_incomplete_head_waits_until_it_outgrows_the_bound():
    partial = POST + b"X-A: " + b"a" * 100
    assert refusal(partial, len(partial)) is None
    assert refusal(partial, MAX_HEAD_BYTES + 1) is not None     # the buffer holds more than a head may
