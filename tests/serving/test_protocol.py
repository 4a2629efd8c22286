"""Request validation (pure): what is accepted, and the status/param of every rejection."""

from __future__ import annotations

import pytest

from serving.server.protocol import APIError, parse_json, parse_request


def test_chat_request_is_normalised():
    spec = parse_request({"model": "m", "messages": [{"role": "user", "content": [{"type": "text", "text": "a"},
                                                                                    {"type": "text", "text": "b"}]}],
                          "max_completion_tokens": 7, "temperature": 0, "stop": "x", "seed": 4,
                          "stream": True, "stream_options": {"include_usage": True}, "top_k": 0}, "chat", "m")
    assert spec.messages == ({"role": "user", "content": "ab"},)
    assert (spec.max_tokens, spec.stop, spec.stream, spec.include_usage) == (7, ("x",), True, True)
    assert spec.sampling.greedy and spec.sampling.seed == 4 and spec.sampling.top_k == -1


def test_completion_prompt_forms():
    assert parse_request({"prompt": "hi"}, "completion", "m").prompt == "hi"
    assert parse_request({"prompt": ["hi"]}, "completion", "m").prompt == "hi"
    assert parse_request({"prompt": [1, 2]}, "completion", "m").prompt == (1, 2)
    assert parse_request({"prompt": "hi", "logprobs": None, "best_of": 1}, "completion", "m").max_tokens is None


@pytest.mark.parametrize("kind,body,status,param", [
    ("completion", {"prompt": "hi", "model": "other"}, 404, "model"),
    ("completion", {"prompt": ""}, 400, "prompt"),
    ("completion", {"prompt": ["a", "b"]}, 400, "prompt"),
    ("completion", {"prompt": [1, -2]}, 400, "prompt"),
    ("completion", {"prompt": [True]}, 400, "prompt"),
    ("completion", {"prompt": "hi", "max_tokens": True}, 400, "max_tokens"),
    ("completion", {"prompt": "hi", "max_tokens": 2.5}, 400, "max_tokens"),
    ("completion", {"prompt": "hi", "top_p": 0}, 400, "top_p"),
    ("completion", {"prompt": "hi", "temperature": 3}, 400, "temperature"),
    ("completion", {"prompt": "hi", "top_k": -5}, 400, "top_k"),
    ("completion", {"prompt": "hi", "stop": [1]}, 400, "stop"),
    ("completion", {"prompt": "hi", "stop": ["s"] * 17}, 400, "stop"),
    ("completion", {"prompt": "hi", "stop_token_ids": "2"}, 400, "stop_token_ids"),
    ("completion", {"prompt": "hi", "logprobs": 3}, 400, "logprobs"),
    ("completion", {"prompt": "hi", "stream_options": 1}, 400, "stream_options"),
    ("chat", {"messages": []}, 400, "messages"),
    ("chat", {"messages": [{"content": "x"}]}, 400, "messages[0].role"),
    ("chat", {"messages": [{"role": "user", "content": 5}]}, 400, "messages[0].content"),
    ("chat", {"messages": ["hi"]}, 400, "messages[0]"),
    ("chat", {"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": 0}, 400, "max_tokens"),
])
def test_rejections_name_the_parameter(kind, body, status, param):
    with pytest.raises(APIError) as info:
        parse_request(body, kind, "m")
    assert (info.value.status, info.value.param) == (status, param)
    assert set(info.value.body()["error"]) == {"message", "type", "param", "code"}


@pytest.mark.parametrize("raw", [b"{", b"\xff\xfe", b"[]", b'"text"', b"null"])
def test_body_must_be_a_json_object(raw):
    with pytest.raises(APIError) as info:
        parse_json(raw)
    assert info.value.status == 400 and info.value.code == "invalid_json"


@pytest.mark.parametrize("body,param", [
    ({"prompt": "a\ud800"}, "prompt"),
    ({"prompt": "hi", "model": "\udfff"}, "model"),
    ({"prompt": "hi", "stop": ["x", "\ud83d"]}, "stop[1]"),
    ({"prompt": "hi", "extra": {"\ud800": 1}}, "extra"),
    ({"prompt": "hi", "seed": 2**64}, "seed"),
    ({"prompt": "hi", "logprobs": 0}, "logprobs"),             # 0 is not False: only the off value passes
    ({"prompt": "hi", "presence_penalty": True}, "presence_penalty"),
    ({"prompt": "hi", "response_format": {"type": "json_object"}}, "response_format"),
])
def test_invalid_text_and_unimplemented_values_are_400s(body, param):
    with pytest.raises(APIError) as info:
        parse_request(body, "completion", "m")
    assert (info.value.status, info.value.param) == (400, param)


def test_off_values_and_paired_surrogates_pass():
    spec = parse_request({"prompt": "smile \U0001F600", "presence_penalty": 0.0, "frequency_penalty": 0,
                          "tools": [], "logit_bias": {}, "seed": -2**63}, "completion", "m")
    assert spec.prompt == "smile \U0001F600" and spec.sampling.seed == -2**63


def test_nesting_is_bounded_without_recursion():
    deep = {"prompt": "hi", "x": []}
    inner = deep["x"]
    for _ in range(5000):
        inner.append([])
        inner = inner[0]
    with pytest.raises(APIError) as info:
        parse_request(deep, "completion", "m")
    assert info.value.status == 400 and info.value.code == "invalid_json"


def test_include_usage_must_be_a_boolean():
    with pytest.raises(APIError) as info:
        parse_request({"prompt": "hi", "stream_options": {"include_usage": "yes"}}, "completion", "m")
    assert info.value.param == "stream_options.include_usage"
