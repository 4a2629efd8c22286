"""The official `openai` client talks to the runtime unchanged (shapes, streaming, errors)."""

from __future__ import annotations

import pytest

from tests.serving.conftest import KEY

import openai  # noqa: E402  (dev dependency: a missing one must fail, not skip)
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def client(tiny_server):
    return openai.OpenAI(base_url=tiny_server.url + "/v1", api_key=KEY, max_retries=0, timeout=60)


def test_models_and_chat(client):
    assert [m.id for m in client.models.list()] == ["tiny"]
    reply = client.chat.completions.create(model="tiny", messages=QUESTION, max_tokens=6, temperature=0)
    assert reply.choices[0].message.role == "assistant"
    assert reply.choices[0].finish_reason == "length" and reply.usage.completion_tokens == 6


def test_streaming_chat_matches_the_whole_reply(client):
    whole = client.chat.completions.create(model="tiny", messages=QUESTION, max_tokens=10, temperature=0)
    stream = client.chat.completions.create(model="tiny", messages=QUESTION, max_tokens=10, temperature=0,
                                            stream=True)
    text = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
    assert text == whole.choices[0].message.content


def test_completions(client):
    result = client.completions.create(model="tiny", prompt="The capital of France is", max_tokens=5, seed=1)
    assert result.object == "text_completion" and result.usage.completion_tokens == 5


def test_errors_map_to_the_clients_exceptions(client, tiny_server):
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="gpt-4", messages=QUESTION)
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="tiny", messages=QUESTION, max_tokens=0)
    assert info.value.body["param"] == "max_tokens"
    stranger = openai.OpenAI(base_url=tiny_server.url + "/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        stranger.models.list()
