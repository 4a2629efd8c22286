"""A request's prompt token ids, without stalling the event loop (docs/contracts.md section 2).

Templating and tokenizing take about a microsecond per character, all of it on the event loop
if done inline: a 1 MB body held every other client for a second. Text up to INLINE_CHARS is
encoded inline (a few milliseconds at most, cheaper than a thread hop); longer text goes to a
pool of `pool_threads()` threads, where tokenizers releases the interpreter lock
(serving.models.tokenizer), and at most POOL_WAITING such prompts wait or run at once (more is
a 503 server_busy). The pool takes at most a quarter of the CPUs (one on a machine of up to 7),
so tokenizing crowds never starve the engine's thread of a CPU: on 2 CPUs, 2 tokenizing
threads tripled a normal SmolLM2 request's time. Text that cannot fit the context is refused from its length before it is
encoded (Tokenizer.check_length), so no request costs more than one context's worth of work.
"""

from __future__ import annotations

import asyncio
import os
from concurrent.futures import ThreadPoolExecutor

from serving.models.tokenizer import PromptTooLong
from serving.server.generation import RETRY_AFTER_S
from serving.server.protocol import APIError, CompletionSpec

INLINE_CHARS = 4096
POOL_WAITING = 16


def pool_threads() -> int:
    """A quarter of the CPUs this process may run on, at least 1, at most 4."""
    return max(1, min(4, len(os.sched_getaffinity(0)) // 4))


class Prompts:
    def __init__(self, state, threads: int | None = None, waiting: int = POOL_WAITING):
        self.state, self.waiting = state, waiting     # AppState: tokenizer, args, vocab_size
        self.pool = ThreadPoolExecutor(threads or pool_threads(), thread_name_prefix="tokenize")
        self.in_pool = 0

    async def ids(self, spec: CompletionSpec) -> list[int]:
        if text_chars(spec) <= INLINE_CHARS:
            return self.encode(spec)
        if self.in_pool >= self.waiting:
            raise APIError(503, f"server busy: {self.in_pool} long prompts are being tokenized; retry later",
                           code="server_busy", kind="server_error", retry_after=RETRY_AFTER_S)
        self.in_pool += 1
        try:
            return await asyncio.get_running_loop().run_in_executor(self.pool, self.encode, spec)
        finally:
            self.in_pool -= 1

    def encode(self, spec: CompletionSpec) -> list[int]:
        """The prompt's ids, or the APIError (400) that refuses it."""
        tok, context = self.state.tokenizer, self.state.args.context_length
        param = "messages" if spec.kind == "chat" else "prompt"
        try:
            if spec.kind == "chat":
                ids = tok.encode_chat(list(spec.messages), limit=context)
            elif isinstance(spec.prompt, tuple):
                ids = list(spec.prompt)
                if max(ids) >= self.state.vocab_size:
                    raise APIError(400, f"token id {max(ids)} is outside the vocabulary", "prompt", "invalid_value")
            else:
                ids = tok.encode(spec.prompt, limit=context)
        except PromptTooLong as e:
            raise APIError(400, f"{e}; this model's context is {context} tokens", param,
                           "context_length_exceeded") from None
        except ValueError as e:                 # the chat template refused the messages
            raise APIError(400, str(e), param, "invalid_value") from None
        if not ids:
            raise APIError(400, "the prompt encodes to no tokens", param, "invalid_value")
        if len(ids) >= context:
            raise APIError(400, f"the prompt is {len(ids)} tokens; this model's context is "
                                f"{context} tokens", param, "context_length_exceeded")
        return ids


def text_chars(spec: CompletionSpec) -> int:
    """Characters the prompt's text holds (token-id prompts: none to encode)."""
    if spec.kind == "chat":
        return sum(len(m["content"]) for m in spec.messages)
    return len(spec.prompt) if isinstance(spec.prompt, str) else 0
