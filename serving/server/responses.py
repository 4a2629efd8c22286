"""OpenAI response and stream-chunk shapes. Pure: data in, dicts out."""

from __future__ import annotations

import json
import time
import uuid


def new_id(kind: str) -> str:
    return ("chatcmpl-" if kind == "chat" else "cmpl-") + uuid.uuid4().hex[:24]


def usage_body(usage) -> dict:
    return {"prompt_tokens": usage.prompt_tokens, "completion_tokens": usage.completion_tokens,
            "total_tokens": usage.prompt_tokens + usage.completion_tokens}


def final_body(kind: str, rid: str, model: str, finished) -> dict:
    if kind == "chat":
        choice = {"index": 0, "message": {"role": "assistant", "content": finished.text},
                  "logprobs": None, "finish_reason": finished.finish_reason}
        obj = "chat.completion"
    else:
        choice = {"index": 0, "text": finished.text, "logprobs": None, "finish_reason": finished.finish_reason}
        obj = "text_completion"
    return {"id": rid, "object": obj, "created": int(time.time()), "model": model,
            "choices": [choice], "usage": usage_body(finished.usage)}


def chunk(kind: str, rid: str, model: str, text: str | None, finish_reason: str | None = None,
          first: bool = False) -> dict:
    if kind == "chat":
        delta = {"role": "assistant", "content": ""} if first else ({"content": text} if text else {})
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        obj = "chat.completion.chunk"
    else:
        choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish_reason}
        obj = "text_completion"
    return {"id": rid, "object": obj, "created": int(time.time()), "model": model, "choices": [choice]}


def usage_chunk(kind: str, rid: str, model: str, usage) -> dict:
    obj = "chat.completion.chunk" if kind == "chat" else "text_completion"
    return {"id": rid, "object": obj, "created": int(time.time()), "model": model, "choices": [],
            "usage": usage_body(usage)}


def sse(payload: dict | str) -> str:
    data = payload if isinstance(payload, str) else json.dumps(payload, ensure_ascii=False)
    return f"data: {data}\n\n"
