"""While the weights load, health says 503 and generation is refused (in-process, no engine yet)."""

from __future__ import annotations

import threading
from dataclasses import replace

import pytest
from fastapi.testclient import TestClient

from serving.config import parse_args, request_bytes_bound, resolve
from serving.engine import Engine
from serving.models import read_model_config
from serving.server.app import AppState, create_app
from tests.serving.fake_runner import FakeRunner


def test_loading_state(tiny_llama, llama_tokenizer):
    args = resolve(parse_args(["--model-path", str(tiny_llama)], environ={}),
                   read_model_config(tiny_llama), cuda_available=False)
    client = TestClient(create_app(AppState(args, llama_tokenizer)))
    health = client.get("/health")
    assert (health.status_code, health.json()) == (503, {"status": "loading"})
    assert client.get("/health_generate").status_code == 503
    refused = client.post("/v1/completions", json={"prompt": "hi"})
    assert refused.status_code == 503 and refused.json()["error"]["code"] == "loading"
    info = client.get("/server_info").json()
    assert info["status"] == "loading" and info["internal_states"][0]["num_requests_total"] == 0


class StuckDecoder(FakeRunner):
    """A decoder whose prefill never finishes in time (a hung device, say)."""

    def __init__(self):
        self.go = threading.Event()

    def start(self, prompt_ids, sampling, max_new_tokens):
        self.go.wait(timeout=30)
        return [1]

    def step(self):
        return [1]


class StuckRoundDecoder(StuckDecoder):
    """Prefill answers at once; the first decode round hangs (a broken drafter, say)."""

    def start(self, prompt_ids, sampling, max_new_tokens):
        return [1]

    def step(self):
        self.go.wait(timeout=30)
        return [1]


@pytest.mark.parametrize("stuck", [StuckDecoder, StuckRoundDecoder], ids=["prefill", "decode-round"])
def test_health_generate_times_out_to_503(stuck, tiny_llama, llama_tokenizer):
    """A hang in the prefill or in the first decode round (the probe runs both) answers 503."""
    args = resolve(parse_args(["--model-path", str(tiny_llama)], environ={}),
                   read_model_config(tiny_llama), cuda_available=False)
    decoder = stuck()
    engine = Engine(lambda: decoder, llama_tokenizer).start()
    state = AppState(replace(args, health_generate_timeout=0.3), llama_tokenizer, engine=engine)
    try:
        probe = TestClient(create_app(state)).get("/health_generate")
        assert probe.status_code == 503 and probe.json()["status"] == "unhealthy"
    finally:
        decoder.go.set()
        engine.stop()


class BrokenTokenizer:
    def encode(self, text, prompt=True):
        raise RuntimeError("tokenizer exploded")


def test_an_unexpected_error_is_still_a_json_500(tiny_llama, llama_tokenizer):
    args = resolve(parse_args(["--model-path", str(tiny_llama)], environ={}),
                   read_model_config(tiny_llama), cuda_available=False)
    engine = Engine(StuckDecoder, llama_tokenizer).start()
    try:
        client = TestClient(create_app(AppState(args, BrokenTokenizer(), engine=engine)),
                            raise_server_exceptions=False)
        response = client.post("/v1/completions", json={"prompt": "hi"})
        assert response.status_code == 500
        assert response.json()["error"]["code"] == "internal_error"
        assert client.get("/health").status_code == 200
    finally:
        engine.stop()


def test_the_body_bound_follows_the_context_and_refuses_from_the_head(tiny_llama, llama_tokenizer):
    """Without --max-request-bytes, a body is worth reading up to 32 bytes a token of context plus
    256 KiB; past that it gets 413 from its Content-Length, before the route reads or parses it."""
    def args(*extra):
        return resolve(parse_args(["--model-path", str(tiny_llama), *extra], environ={}),
                       read_model_config(tiny_llama), cuda_available=False)

    bound = args("--context-length", "1024").max_request_bytes
    assert bound == request_bytes_bound(1024) == 1024 * 32 + 256 * 1024
    assert args("--context-length", "1024", "--max-request-bytes", "5000").max_request_bytes == 5000
    client = TestClient(create_app(AppState(args("--context-length", "1024"), llama_tokenizer)))

    def post(size: int):
        body = b'{"prompt": "' + b"a" * (size - 14) + b'"}'
        assert len(body) == size
        return client.post("/v1/completions", content=body, headers={"content-type": "application/json"})

    over = post(bound + 1)
    assert over.status_code == 413 and over.json()["error"]["code"] == "request_too_large"
    assert str(bound) in over.json()["error"]["message"]
    assert post(bound).status_code == 503          # read: the route answers (still loading)
