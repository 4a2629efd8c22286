"""A client that goes away cancels its generation, streaming or not; a full queue refuses a stream
with 503 before it starts. In-process over ASGI with a decoder that counts its rounds (the
real-server side of both is in test_hardening.py)."""

from __future__ import annotations

import asyncio
import json
import threading

import pytest
from fastapi.testclient import TestClient

from serving.config import parse_args, resolve
from serving.engine import Engine, GenerationRequest, StopRule
from serving.models import read_model_config
from serving.sampling import SamplingParams
from serving.server.app import AppState, create_app
from tests.serving.fake_runner import FakeRunner

MAX_TOKENS = 200


class CountingDecoder(FakeRunner):
    """One token per round, each round `round_s` long; `rounds` counts the rounds run."""

    def __init__(self, round_s: float = 0.01):
        self.round_s, self.rounds = round_s, 0
        self.started = threading.Event()

    def start(self, prompt_ids, sampling, max_new_tokens):
        self.started.set()
        return [7]

    def step(self):
        threading.Event().wait(self.round_s)
        self.rounds += 1
        return [7]


@pytest.fixture
def app_with(tiny_llama, llama_tokenizer):
    engines = []

    def build(decoder, max_queued=8):
        args = resolve(parse_args(["--model-path", str(tiny_llama)], environ={}),
                       read_model_config(tiny_llama), cuda_available=False)
        engine = Engine(lambda: decoder, llama_tokenizer, max_queued=max_queued).start()
        engines.append(engine)
        return create_app(AppState(args, llama_tokenizer, engine=engine)), engine

    yield build
    for engine in engines:
        engine.stop()


async def call_then_leave(app, body: dict, leave_after_s: float) -> list[dict]:
    """POST body to /v1/completions over ASGI; the client disconnects after `leave_after_s`."""
    scope = {"type": "http", "method": "POST", "path": "/v1/completions", "raw_path": b"/v1/completions",
             "query_string": b"", "headers": [(b"content-type", b"application/json")], "http_version": "1.1",
             "scheme": "http", "server": ("127.0.0.1", 1), "client": ("127.0.0.1", 2), "root_path": ""}
    messages = [{"type": "http.request", "body": json.dumps(body).encode(), "more_body": False}]
    sent = []

    async def receive():
        if messages:
            return messages.pop()
        await asyncio.sleep(leave_after_s)
        return {"type": "http.disconnect"}

    async def send(message):
        sent.append(message)

    await asyncio.wait_for(app(scope, receive, send), timeout=30)
    return sent


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_leaving_client_stops_its_generation(app_with, stream):
    decoder = CountingDecoder()
    app, _ = app_with(decoder)
    body = {"prompt": "hi", "max_tokens": MAX_TOKENS, "ignore_eos": True, "stream": stream}
    asyncio.run(call_then_leave(app, body, leave_after_s=0.2))
    settled = decoder.rounds
    threading.Event().wait(0.3)
    # stopped within a round of the disconnect, far short of the 200 asked for, and stays stopped
    assert 0 < settled < MAX_TOKENS // 2 and decoder.rounds <= settled + 1


def test_leaving_client_of_a_queued_request_never_runs(app_with):
    decoder = CountingDecoder(round_s=0.05)
    app, engine = app_with(decoder)
    blocker = GenerationRequest([1], SamplingParams(temperature=0), StopRule(max_new_tokens=12), lambda e: None)
    engine.submit(blocker)                     # runs ~0.6 s while the HTTP request waits in the queue
    decoder.started.wait(5)
    asyncio.run(call_then_leave(app, {"prompt": "hi", "max_tokens": MAX_TOKENS, "ignore_eos": True}, 0.1))
    threading.Event().wait(0.9)
    assert decoder.rounds <= 12                # only the blocker's rounds: the abandoned one was skipped


def test_full_queue_refuses_a_stream_before_it_starts(app_with):
    decoder = CountingDecoder(round_s=0.05)
    app, engine = app_with(decoder, max_queued=1)
    held = [GenerationRequest([1], SamplingParams(temperature=0), StopRule(max_new_tokens=1000), lambda e: None)
            for _ in range(2)]
    for request in held:                       # one running, one waiting: the queue is full
        engine.submit(request)
        decoder.started.wait(5)
    try:
        response = TestClient(app).post("/v1/completions", json={"prompt": "hi", "stream": True})
    finally:
        for request in held:
            request.cancelled.set()
    assert response.status_code == 503 and response.headers["retry-after"] == "1"
    assert response.headers["content-type"] == "application/json"
    assert response.json()["error"]["code"] == "server_busy"
