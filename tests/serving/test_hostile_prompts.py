"""Long prompts are encoded off the event loop, and bounded (issue 26); milliseconds, on the tiny
checkpoint's real tokenizer (the HTTP side is in test_hostile_http.py, the latency figure comes
from `python -m serving.bench.hostile`)."""

from __future__ import annotations

import asyncio
import threading
from types import SimpleNamespace

import pytest

from serving.models.tokenizer import Tokenizer
from serving.sampling import SamplingParams
from serving.server.prompting import INLINE_CHARS, Prompts
from serving.server.protocol import APIError, CompletionSpec


def chat(content: str) -> CompletionSpec:
    return CompletionSpec("chat", None, ({"role": "user", "content": content},), 2, SamplingParams(),
                          (), (), False, False, False)


class Recording:
    """The real tokenizer, noting which thread each chat was encoded on."""

    def __init__(self, tokenizer):
        self.tokenizer, self.threads = tokenizer, []

    def encode_chat(self, messages, limit=None):
        self.threads.append(threading.current_thread().name)
        return self.tokenizer.encode_chat(messages, limit=limit)


def prompts(tokenizer, context: int = 100_000, waiting: int = 16) -> Prompts:
    state = SimpleNamespace(tokenizer=tokenizer, args=SimpleNamespace(context_length=context), vocab_size=512)
    return Prompts(state, waiting=waiting)


def test_short_text_inline_long_text_on_a_pool_thread(llama_tokenizer):
    recording = Recording(llama_tokenizer)
    builder = prompts(recording)
    short = asyncio.run(builder.ids(chat("hi")))
    long = asyncio.run(builder.ids(chat("a b " * INLINE_CHARS)))
    assert recording.threads[0] == threading.current_thread().name
    assert recording.threads[1].startswith("tokenize")
    assert short == llama_tokenizer.encode_chat([{"role": "user", "content": "hi"}])
    assert long == llama_tokenizer.encode_chat([{"role": "user", "content": "a b " * INLINE_CHARS}])


def test_a_full_pool_is_a_503_not_a_queue(llama_tokenizer):
    with pytest.raises(APIError) as info:
        asyncio.run(prompts(llama_tokenizer, waiting=0).ids(chat("x " * INLINE_CHARS)))
    assert info.value.status == 503 and info.value.code == "server_busy" and info.value.retry_after


class CountingBackend:
    """The real tokenizers backend, counting encode calls."""

    def __init__(self, backend):
        self.backend, self.encodes = backend, 0

    def encode_batch(self, *args, **kwargs):
        self.encodes += 1
        return self.backend.encode_batch(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.backend, name)


def test_text_past_the_context_is_refused_before_encoding(tiny_llama):
    tokenizer = Tokenizer.from_dir(tiny_llama)
    tokenizer.backend = counting = CountingBackend(tokenizer.backend)
    limit = 64 * tokenizer.longest_token_chars
    with pytest.raises(APIError) as info:
        prompts(tokenizer, context=64).encode(chat("x" * (limit + 1)))
    assert info.value.code == "context_length_exceeded" and "characters" in info.value.message
    assert counting.encodes == 0
    assert prompts(tokenizer, context=64).encode(chat("x" * 50)) and counting.encodes == 1


def test_words_far_past_the_context_are_refused_from_a_prefix(tiny_llama):
    tokenizer = Tokenizer.from_dir(tiny_llama)
    text = ("a b " * 700).strip()            # under the character bound, far past 256 tokens
    whole = len(tokenizer.encode(text, prompt=False))
    tokenizer.backend = counting = CountingBackend(tokenizer.backend)
    assert len(text) < 256 * tokenizer.longest_token_chars and whole > 256
    with pytest.raises(APIError) as info:
        prompts(tokenizer, context=256).encode(chat(text))
    assert "first" in info.value.message and info.value.code == "context_length_exceeded"
    assert counting.encodes == 1             # the prefix, never the whole text
