"""Hostile input over real HTTP: a 4xx JSON error on the same keep-alive connection, never a 5xx
or a reset; overload, slow clients and unkeyed probes handled (issue 16, runtime side)."""

from __future__ import annotations

import http.client
import json
import socket
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from serving.server.app import HEALTH_TOKENS
from tests.serving.conftest import KEY
from tests.server_process import ServerProcess

AUTH = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
CHAT = '{"messages": [{"role": "user", "content": %s}], "max_tokens": 2}'
SURROGATE = '"a\\ud800b"'           # JSON text: an escaped, unpaired UTF-16 surrogate


@pytest.fixture(scope="module")
def strict_server(tiny_llama, tmp_path_factory):
    """Short read deadlines, a queue of one, a long-lived probe cache, a keyed /metrics."""
    log = tmp_path_factory.mktemp("strict") / "server.log"
    proc = ServerProcess(tiny_llama, log, "--api-key", KEY, "--served-model-name", "tiny",
                         "--max-running-requests", "1", "--timeout-request-headers", "1",
                         "--timeout-request-body", "1", "--health-generate-interval", "5",
                         "--metrics-require-api-key")
    yield proc.wait_ready()
    proc.stop()


def exchange(conn: http.client.HTTPConnection, path: str, body: bytes | None = None,
             headers: dict | None = None) -> tuple[int, dict, bytes]:
    conn.request("POST" if body is not None else "GET", path, body=body, headers=headers or AUTH)
    response = conn.getresponse()
    return response.status, dict(response.getheaders()), response.read()


@pytest.mark.parametrize("path,body,param", [
    ("/v1/completions", '{"prompt": %s}' % SURROGATE, "prompt"),
    ("/v1/completions", '{"prompt": "hi", "stop": [%s]}' % SURROGATE, "stop[0]"),
    ("/v1/completions", '{"prompt": "hi", "model": %s}' % SURROGATE, "model"),
    ("/v1/chat/completions", CHAT % SURROGATE, "messages[0].content"),
    ("/v1/chat/completions", CHAT % '[{"type": "text", "text": "\\udfff"}]', "messages[0].content[0].text"),
    ("/v1/completions", b'{"prompt": "\xff\xfe"}', None),                 # raw invalid UTF-8
    ("/v1/completions", b'{"prompt": "\xed\xa0\x80"}', None),             # a surrogate encoded as bytes
    ("/v1/completions", '{"prompt": "hi", "x": %s}' % ("[" * 1000 + "]" * 1000), None),
    ("/v1/completions", '{"prompt": "hi", "x": %s}' % ("[" * 40 + "]" * 40), "x" + "[0]" * 31),
    ("/v1/completions", "[" * 30_000 + "]" * 30_000, None),
    ("/v1/completions", '{"prompt": "hi", "seed": %d}' % 2**64, "seed"),
    ("/v1/completions", '{"prompt": "hi", "seed": %d}' % (-2**63 - 1), "seed"),
    ("/v1/completions", '{"prompt": "hi", "max_tokens": 1%s}' % ("0" * 5000), None),
    ("/v1/completions", '{"prompt": "hi", "temperature": NaN}', None),
    ("/v1/completions", '{"prompt": "hi", "top_p": Infinity}', None),
])
def test_hostile_body_is_a_400_and_the_connection_keeps_serving(server, path, body, param):
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
    status, _, raw = exchange(conn, path, body if isinstance(body, bytes) else body.encode())
    error = json.loads(raw)["error"]
    assert status == 400 and error["param"] == param and error["message"]
    sock = conn.sock
    status, _, raw = exchange(conn, "/v1/completions", b'{"prompt": "hi", "max_tokens": 2}')
    assert status == 200 and json.loads(raw)["usage"]["completion_tokens"] == 2
    assert conn.sock is sock and sock is not None     # the same keep-alive connection
    conn.close()


@pytest.fixture(scope="module")
def server(tiny_server):
    return tiny_server


def completion(client: httpx.Client, **fields) -> httpx.Response:
    return client.post("/v1/completions", json={"prompt": [5, 17, 42, 99, 3], "max_tokens": 8, **fields})


@pytest.fixture(scope="module")
def client(server):
    with httpx.Client(base_url=server.url, headers=AUTH, timeout=60) as c:
        yield c


@pytest.mark.parametrize("fields", [{"temperature": 1e-45}, {"temperature": 5e-324, "seed": 1},
                                    {"top_p": 1e-300}, {"top_p": 5e-324, "temperature": 2.0}])
def test_vanishing_temperature_or_top_p_is_the_greedy_answer(client, fields):
    greedy = completion(client, temperature=0).json()["choices"][0]["text"]
    response = completion(client, **fields)
    assert response.status_code == 200 and response.json()["choices"][0]["text"] == greedy


@pytest.mark.parametrize("field,value", [
    ("response_format", {"type": "json_object"}), ("tools", [{"type": "function", "function": {"name": "f"}}]),
    ("tool_choice", "auto"), ("logit_bias", {"42": 5}), ("presence_penalty", 0.5),
    ("frequency_penalty", -1), ("logprobs", True), ("n", 2),
])
def test_unimplemented_fields_are_refused_not_ignored(client, field, value):
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, field: value}
    response = client.post("/v1/chat/completions", json=body)
    assert response.status_code == 400 and response.json()["error"]["param"] == field
    off = {"response_format": {"type": "text"}, "tools": [], "tool_choice": "none", "logit_bias": {},
           "presence_penalty": 0, "frequency_penalty": 0.0, "logprobs": False, "n": 1}[field]
    assert client.post("/v1/chat/completions", json={**body, field: off}).status_code == 200


def test_overloaded_stream_is_a_503_before_the_stream_starts(strict_server):
    """Queue of one: of 8 simultaneous long streams, each is a complete stream or a JSON 503."""
    body = {"prompt": "hi", "max_tokens": 400, "ignore_eos": True, "stream": True, "temperature": 0}

    def ask(_):
        with httpx.Client(base_url=strict_server.url, headers=AUTH, timeout=120) as c:
            with c.stream("POST", "/v1/completions", json=body) as response:
                return response.status_code, response.headers, response.read()

    with ThreadPoolExecutor(max_workers=8) as pool:
        answers = list(pool.map(ask, range(8)))
    busy = [(h, raw) for status, h, raw in answers if status == 503]
    done = [raw for status, _, raw in answers if status == 200]
    assert len(busy) + len(done) == 8 and busy and done
    for headers, raw in busy:
        assert headers["retry-after"].isdigit() and headers["content-type"] == "application/json"
        assert json.loads(raw)["error"]["code"] == "server_busy"
    for raw in done:
        assert raw.endswith(b"data: [DONE]\n\n") and b'"finish_reason":"length"' in raw.replace(b" ", b"")


def test_partial_requests_are_closed_and_do_not_stall_others(strict_server):
    """300 connections stuck mid-headers, and one stuck mid-body: normal requests still answer,
    and the server closes the stuck ones after the 1 s deadline."""
    stuck = []
    for _ in range(300):
        s = socket.create_connection(("127.0.0.1", strict_server.port))
        s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")
        stuck.append(s)
    body_stuck = socket.create_connection(("127.0.0.1", strict_server.port))
    body_stuck.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n"
                       b"Authorization: Bearer " + KEY.encode() + b"\r\n\r\n{\"pro")
    stuck.append(body_stuck)
    with httpx.Client(base_url=strict_server.url, headers=AUTH, timeout=30) as c:
        assert c.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2}).status_code == 200
    for s in stuck:
        s.settimeout(30)
        assert s.recv(1024) == b""           # closed by the server (never answered)
        s.close()


def test_a_disconnected_client_is_counted_and_the_server_keeps_serving(strict_server):
    s = socket.create_connection(("127.0.0.1", strict_server.port))
    body = json.dumps({"prompt": "hi", "max_tokens": 500, "ignore_eos": True}).encode()
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              b"Authorization: Bearer " + KEY.encode() + b"\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
    s.close()
    with httpx.Client(base_url=strict_server.url, headers=AUTH, timeout=60) as c:
        assert c.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2}).status_code == 200
        metrics = c.get("/metrics").text
    assert 'serving_requests_total{path="/v1/completions",status="499"}' in metrics


def test_unkeyed_health_probes_share_one_generation(strict_server):
    def total(c):
        return c.get("/server_info").json()["internal_states"][0]["num_requests_total"]

    with httpx.Client(base_url=strict_server.url, headers=AUTH, timeout=60) as keyed:
        before = total(keyed)
        with ThreadPoolExecutor(max_workers=20) as pool:
            probes = list(pool.map(lambda _: httpx.get(strict_server.url + "/health_generate", timeout=60),
                                   range(20)))
        assert all(p.status_code == 200 and len(p.json()["tokens"]) == HEALTH_TOKENS for p in probes)
        assert total(keyed) - before <= 2     # one probe per 5 s cache period, whoever asks


def test_metrics_can_require_the_key(strict_server):
    assert httpx.get(strict_server.url + "/metrics").status_code == 401
    assert httpx.get(strict_server.url + "/metrics", headers=AUTH).status_code == 200
    assert httpx.get(strict_server.url + "/health_generate", timeout=60).status_code == 200
