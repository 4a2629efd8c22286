"""The runtime as a real process on a loopback port, exercised over HTTP with httpx."""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from serving.server.app import HEALTH_TOKENS
from tests.serving.conftest import BODY_LIMIT, KEY
from tests.serving.test_engine import reference_greedy

AUTH = {"Authorization": f"Bearer {KEY}"}
PROMPT_IDS = [5, 17, 42, 99, 3]
CHAT = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def server(tiny_server):
    return tiny_server


@pytest.fixture(scope="module")
def client(server):
    with httpx.Client(base_url=server.url, headers=AUTH, timeout=60) as c:
        yield c


def sse_events(response) -> list:
    events = []
    for line in response.iter_lines():
        if line.startswith("data: "):
            data = line[len("data: "):]
            events.append(data if data == "[DONE]" else json.loads(data))
    return events


def test_health_endpoints_need_no_key(server):
    assert httpx.get(server.url + "/health").json() == {"status": "ok"}
    probe = httpx.get(server.url + "/health_generate", timeout=60)
    # HEALTH_TOKENS tokens: the prefill gives the first, a plain decoder round each further one
    assert probe.status_code == 200 and len(probe.json()["tokens"]) == HEALTH_TOKENS
    assert probe.json()["rounds"] == HEALTH_TOKENS - 1
    assert "serving_requests_total" in httpx.get(server.url + "/metrics").text


def test_api_key_is_required_elsewhere(server):
    for path in ("/v1/models", "/server_info"):
        response = httpx.get(server.url + path)
        assert response.status_code == 401
        assert response.json()["error"]["code"] == "invalid_api_key"
    wrong = httpx.post(server.url + "/v1/completions", json={"prompt": "x"}, headers={"Authorization": "Bearer no"})
    assert wrong.status_code == 401


def test_models_lists_the_served_name(client):
    data = client.get("/v1/models").json()
    assert data["object"] == "list" and [m["id"] for m in data["data"]] == ["tiny"]
    assert data["data"][0]["max_model_len"] == 256


def test_completion_is_the_models_greedy_continuation(client, llama_model, llama_tokenizer):
    response = client.post("/v1/completions", json={"model": "tiny", "prompt": PROMPT_IDS, "max_tokens": 8,
                                                    "temperature": 0})
    body = response.json()
    assert response.status_code == 200 and body["object"] == "text_completion"
    expected = llama_tokenizer.decode(reference_greedy(llama_model, PROMPT_IDS, 8))
    assert body["choices"][0]["text"] == expected
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["usage"] == {"prompt_tokens": 5, "completion_tokens": 8, "total_tokens": 13}


def test_chat_uses_the_chat_template(client, llama_tokenizer):
    body = client.post("/v1/chat/completions", json={"messages": CHAT, "max_tokens": 6, "temperature": 0}).json()
    assert body["object"] == "chat.completion"
    assert body["choices"][0]["message"]["role"] == "assistant"
    assert body["usage"]["prompt_tokens"] == len(llama_tokenizer.encode_chat(CHAT))
    assert body["usage"]["completion_tokens"] == 6


@pytest.mark.parametrize("path,payload", [
    ("/v1/chat/completions", {"messages": CHAT}),
    ("/v1/completions", {"prompt": "The capital of France is"}),
])
def test_streaming_equals_the_whole_answer(client, path, payload):
    payload = {**payload, "max_tokens": 12, "temperature": 0}
    whole = client.post(path, json=payload).json()["choices"][0]
    with client.stream("POST", path, json={**payload, "stream": True,
                                           "stream_options": {"include_usage": True}}) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        events = sse_events(response)
    assert events[-1] == "[DONE]"
    assert events[-2]["usage"]["completion_tokens"] == 12 and events[-2]["choices"] == []
    chunks = [e["choices"][0] for e in events[:-2]]
    assert chunks[-1]["finish_reason"] == "length"
    if path == "/v1/chat/completions":
        assert chunks[0]["delta"] == {"role": "assistant", "content": ""}
        text = "".join(c["delta"].get("content", "") for c in chunks)
        assert text == whole["message"]["content"]
    else:
        assert "".join(c["text"] for c in chunks) == whole["text"]


def test_stop_string_and_seed_over_http(client):
    payload = {"prompt": "The quick brown fox", "max_tokens": 24, "temperature": 1.0, "seed": 3}
    free = client.post("/v1/completions", json=payload).json()["choices"][0]["text"]
    assert client.post("/v1/completions", json=payload).json()["choices"][0]["text"] == free
    stop = free[8:11]
    cut = client.post("/v1/completions", json={**payload, "stop": [stop]}).json()["choices"][0]
    assert cut["finish_reason"] == "stop" and cut["text"] == free[:free.index(stop)]


def test_stop_token_ids(client, llama_model, llama_tokenizer):
    expected = reference_greedy(llama_model, PROMPT_IDS, 10)
    stop_id = expected[4]
    cut = expected.index(stop_id)
    body = client.post("/v1/completions", json={"prompt": PROMPT_IDS, "max_tokens": 10, "temperature": 0,
                                                "stop_token_ids": [stop_id]}).json()
    assert body["choices"][0]["finish_reason"] == "stop"
    assert body["choices"][0]["text"] == llama_tokenizer.decode(expected[:cut])
    assert body["usage"]["completion_tokens"] == cut + 1


LONG_PROMPT = "word " * 400


@pytest.mark.parametrize("path,body,status,param", [
    ("/v1/completions", b'{"prompt": "hi", "max_tokens": 5', 400, None),
    ("/v1/completions", b'[1, 2, 3]', 400, None),
    ("/v1/completions", {"prompt": "hi", "max_tokens": "5"}, 400, "max_tokens"),
    ("/v1/completions", {"prompt": "hi", "max_tokens": 0}, 400, "max_tokens"),
    ("/v1/completions", {"prompt": "hi", "max_tokens": -3}, 400, "max_tokens"),
    ("/v1/completions", {"prompt": "hi", "temperature": "hot"}, 400, "temperature"),
    ("/v1/completions", {"prompt": "hi", "stream": "yes"}, 400, "stream"),
    ("/v1/completions", {"max_tokens": 5}, 400, "prompt"),
    ("/v1/completions", {"prompt": [1, 99999]}, 400, "prompt"),
    ("/v1/completions", {"prompt": "hi", "n": 3}, 400, "n"),
    ("/v1/completions", {"prompt": LONG_PROMPT}, 400, "prompt"),
    ("/v1/completions", {"prompt": "hi", "max_tokens": 300}, 400, "max_tokens"),
    ("/v1/chat/completions", {"model": "tiny"}, 400, "messages"),
    ("/v1/chat/completions", {"messages": "hello"}, 400, "messages"),
    ("/v1/chat/completions", {"messages": [{"role": "wizard", "content": "x"}]}, 400, "messages[0].role"),
    ("/v1/chat/completions", {"messages": CHAT, "model": "gpt-4"}, 404, "model"),
    ("/v1/completions", {"prompt": "x" * (BODY_LIMIT + 10)}, 413, None),
])
def test_bad_input_gets_a_json_error_and_the_server_keeps_serving(client, path, body, status, param):
    if isinstance(body, bytes):
        response = client.post(path, content=body, headers={"Content-Type": "application/json"})
    else:
        response = client.post(path, json=body)
    assert response.status_code == status
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    assert error["param"] == param
    good = client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2})
    assert good.status_code == 200 and good.json()["usage"]["completion_tokens"] == 2


def test_oversized_body_without_content_length(client):
    def chunks():
        for _ in range(BODY_LIMIT // 1024 + 2):
            yield b"x" * 1024

    response = client.post("/v1/completions", content=chunks(), headers={"Content-Type": "application/json"})
    assert response.status_code == 413
    assert client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 1}).status_code == 200


def test_unknown_path_is_a_json_404(client):
    response = client.get("/v1/nothing")
    assert response.status_code == 404 and "error" in response.json()


def test_concurrent_requests_all_complete_correctly(server, client):
    prompts = [[5, 17 + i, 42, 99, 3] for i in range(6)]
    payloads = [{"prompt": p, "max_tokens": 8, "temperature": 0} for p in prompts]
    sequential = [client.post("/v1/completions", json=p).json()["choices"][0]["text"] for p in payloads]

    def ask(payload):
        with httpx.Client(base_url=server.url, headers=AUTH, timeout=120) as c:
            return c.post("/v1/completions", json=payload).json()["choices"][0]["text"]

    with ThreadPoolExecutor(max_workers=6) as pool:
        assert list(pool.map(ask, payloads)) == sequential


def test_a_client_leaving_mid_stream_does_not_hurt_the_server(client):
    with client.stream("POST", "/v1/completions", json={"prompt": "hi", "max_tokens": 200, "stream": True,
                                                        "ignore_eos": True}) as response:
        next(response.iter_lines())
    assert client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 3}).status_code == 200


def test_server_info_reports_resolved_arguments_and_statistics(client):
    before = client.get("/server_info").json()["internal_states"][0]["num_requests_total"]
    client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 4})
    info = client.get("/server_info").json()
    assert info["served_model_name"] == "tiny" and info["context_length"] == 256
    assert (info["dtype"], info["device"], info["speculative_algorithm"]) == ("float32", "cpu", None)
    # built on this host at start (make setup installs gcc) and probed against PyTorch
    assert (info["kernels"]["decode_attention"], info["kernels"]["rms_norm"]) == ("native", "native")
    assert "api_key" not in info and KEY not in json.dumps(info)
    state = info["internal_states"][0]
    assert state["num_requests_total"] == before + 1
    assert state["avg_spec_accept_length"] == 1.0 and state["last_gen_throughput"] > 0


def test_metrics_count_tokens_and_latency(server, client):
    client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 4})
    text = httpx.get(server.url + "/metrics").text
    values = {line.split(" ")[0]: float(line.split(" ")[1]) for line in text.splitlines()
              if line and not line.startswith("#")}
    assert values["serving_generation_tokens_total"] >= 4
    assert values['serving_time_to_first_token_seconds_count{outcome="finished"}'] >= 1
    assert values['serving_e2e_request_latency_seconds_count{outcome="finished"}'] >= 1
    assert values["serving_avg_spec_accept_length"] == 1.0
    assert values['serving_requests_total{path="/v1/completions",status="200"}'] >= 1


def test_time_to_first_token_counts_from_the_request_arrival(client):
    """The TTFT metric starts when the request's headers arrive, not when the engine takes it:
    a body that takes a second to upload adds that second (as a client-side clock sees it)."""
    def ttft_sum() -> float:
        lines = client.get("/metrics").text.splitlines()
        return float(next(line for line in lines if line.startswith("serving_time_to_first_token_seconds_sum"))
                     .rsplit(None, 1)[1])

    before = ttft_sum()
    body = json.dumps({"model": "tiny", "prompt": PROMPT_IDS, "max_tokens": 2, "temperature": 0}).encode()

    def slow_upload():
        yield body[:8]
        time.sleep(1.0)
        yield body[8:]

    response = client.post("/v1/completions", content=slow_upload(), headers={"Content-Type": "application/json"})
    assert response.status_code == 200
    assert ttft_sum() - before >= 1.0
