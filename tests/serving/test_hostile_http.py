"""Hostile HTTP against a real server on loopback (issue 26): framing two parsers could read two
ways is a JSON 400 and a closed connection, never a second response; the key's scheme in any
case, never two keys; HEAD where GET works; a BOM before JSON ignored; an abandoned stream is
counted as 499 and its tokens as generated; long prompts refused by length."""

from __future__ import annotations

import json
import re
import time

import httpx
import openai
import pytest

from serving.bench.hostile import ambiguous_requests, exchange, statuses
from tests.serving.conftest import KEY

AUTH = b"Authorization: Bearer " + KEY.encode() + b"\r\n"
BODY = b'{"prompt": "hi", "max_tokens": 2}'
AMBIGUOUS = ambiguous_requests(KEY)     # each followed by a keyed request, answered 200 if ever read


@pytest.fixture(scope="module")
def server(tiny_server):
    return tiny_server


@pytest.mark.parametrize("pieces", AMBIGUOUS.values(), ids=AMBIGUOUS.keys())
def test_ambiguous_framing_is_one_json_400_then_the_connection_closes(server, pieces):
    raw = exchange(server.port, pieces)
    assert not raw.endswith(b"<still open>")
    assert statuses(raw) == [400]                         # no second response, smuggled or not
    head, _, body = raw.partition(b"\r\n\r\n")
    assert b"connection: close" in head.lower()
    assert json.loads(body)["error"]["code"] == "invalid_http"
    with httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {KEY}"}) as client:
        assert client.post("/v1/completions", content=BODY).status_code == 200     # still serving


def requests_counted(server, path: str, status: str) -> float:
    text = httpx.get(server.url + "/metrics").text
    line = f'serving_requests_total{{path="{path}",status="{status}"}} '
    return next((float(x.split()[-1]) for x in text.splitlines() if x.startswith(line)), 0.0)


@pytest.mark.parametrize("case", ["content-length and transfer-encoding", "broken chunk size"])
def test_framing_refusals_count_as_400_not_499(server, case):
    before = [requests_counted(server, "/v1/completions", s) for s in ("400", "499")]
    exchange(server.port, AMBIGUOUS[case])
    after = [requests_counted(server, "/v1/completions", s) for s in ("400", "499")]
    assert after == [before[0] + 1, before[1]]


@pytest.mark.parametrize("value,status", [
    (f"bearer {KEY}", 200), (f"BEARER {KEY}", 200), (f"Bearer  {KEY}", 200),
    (f"Basic {KEY}", 401), (f"Bearer {KEY}x", 401), (KEY, 401),
])
def test_the_auth_scheme_is_case_insensitive(server, value, status):
    assert httpx.get(server.url + "/v1/models", headers={"Authorization": value}).status_code == status


def test_two_authorization_headers_are_refused_even_when_one_is_right(server):
    for pair in ([AUTH, b"Authorization: Bearer wrong\r\n"], [b"Authorization: Bearer wrong\r\n", AUTH], [AUTH, AUTH]):
        raw = exchange(server.port, (b"GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                                     + b"".join(pair) + b"\r\n",))
        assert statuses(raw) == [400] and b"more than one Authorization header" in raw


@pytest.mark.parametrize("path,status", [("/health", 200), ("/v1/models", 200), ("/metrics", 200),
                                         ("/v1/completions", 405)])
def test_head_answers_where_get_does_without_a_body(server, path, status):
    get = httpx.get(server.url + path, headers={"Authorization": f"Bearer {KEY}"})
    raw = exchange(server.port, (f"HEAD {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n".encode() + AUTH + b"\r\n",))
    head, _, body = raw.partition(b"\r\n\r\n")
    assert statuses(raw) == [status] and body == b""
    if status == 200:
        assert get.status_code == 200 and b"content-type: " + get.headers["content-type"].encode() in head


def test_a_json_body_after_a_byte_order_mark_is_the_same_request(server):
    with httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {KEY}",
                                                    "Content-Type": "application/json"}, timeout=60) as client:
        plain = client.post("/v1/completions", content=b'{"prompt": [5, 17], "max_tokens": 4, "temperature": 0}')
        marked = client.post("/v1/completions", content=b"\xef\xbb\xbf" + plain.request.content)
        twice = client.post("/v1/completions", content=b"\xef\xbb\xbf" * 2 + plain.request.content)
    assert marked.status_code == 200 and marked.json()["choices"] == plain.json()["choices"]
    assert twice.status_code == 400 and twice.json()["error"]["code"] == "invalid_json"


def test_text_far_past_the_context_is_refused_by_its_length(server):
    with httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {KEY}"}, timeout=60) as client:
        for path, body in (("/v1/completions", {"prompt": "hello " * 10_000}),
                           ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hello " * 10_000}]})):
            error = client.post(path, json=body).json()["error"]
            assert error["code"] == "context_length_exceeded"
            assert re.match(r"the prompt is 600\d\d characters", error["message"])   # the template's, for chat


def metric(server, name: str) -> float:
    text = httpx.get(server.url + "/metrics").text
    return next((float(x.split()[-1]) for x in text.splitlines() if x.startswith(name + " ")), 0.0)


CANCELLED_E2E = 'serving_e2e_request_latency_seconds_count{outcome="cancelled"}'


def test_an_abandoned_stream_counts_as_499_and_its_tokens_count(server):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0, timeout=60)
    path = "/v1/chat/completions"
    before = (requests_counted(server, path, "200"), requests_counted(server, path, "499"),
              metric(server, CANCELLED_E2E), metric(server, "serving_generation_tokens_total"))
    stream = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}],
                                            max_tokens=230, stream=True, extra_body={"ignore_eos": True})
    received = 0
    for chunk in stream:                       # the role chunk, then two tokens' text, then leave
        received += bool(chunk.choices[0].delta.content)
        if received == 2:
            break
    stream.close()
    deadline = time.monotonic() + 60           # the server notices the close, then counts
    while requests_counted(server, path, "499") == before[1] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert requests_counted(server, path, "499") == before[1] + 1
    assert requests_counted(server, path, "200") == before[0]
    assert metric(server, CANCELLED_E2E) == before[2] + 1
    assert metric(server, "serving_generation_tokens_total") >= before[3] + 2
