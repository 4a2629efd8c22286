"""OpenAI request bodies -> frozen, validated requests; OpenAI-style errors. Pure, no I/O.

Every rejection is an `APIError` with the status and the offending parameter, so the handler
turns it into `{"error": {"message", "type", "param", "code"}}` and keeps serving.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from serving.sampling import SamplingParams

ROLES = ("system", "developer", "user", "assistant", "tool")
DEFAULT_MAX_TOKENS = {"completion": 16, "chat": 128}
MAX_STOP_STRINGS = 16
MAX_DEPTH = 32                 # request bodies nest a few levels; deeper is refused, never recursed into
SEED_RANGE = (-(1 << 63), (1 << 64) - 1)     # what torch.Generator.manual_seed takes
# fields we do not implement -> the values that mean "off" (anything else is refused, not ignored)
UNSUPPORTED = {"logprobs": (False,), "top_logprobs": (0,), "echo": (False,), "best_of": (1,), "suffix": ("",),
               "response_format": ({"type": "text"},), "tools": ([],), "tool_choice": ("none",),
               "functions": ([],), "function_call": ("none",), "logit_bias": ({},),
               "presence_penalty": (0,), "frequency_penalty": (0,), "repetition_penalty": (1,)}


class APIError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None,
                 code: str | None = None, kind: str = "invalid_request_error", retry_after: int | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.kind = status, message, param, code, kind
        self.retry_after = retry_after           # seconds, sent as Retry-After (503 server_busy)

    def headers(self) -> dict[str, str]:
        return {"Retry-After": str(self.retry_after)} if self.retry_after is not None else {}

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


@dataclass(frozen=True)
class CompletionSpec:
    kind: str                                  # "completion" or "chat"
    prompt: str | tuple[int, ...] | None       # completion: text or token ids
    messages: tuple[dict, ...] | None          # chat: [{"role", "content": str}]
    max_tokens: int | None                     # None: the server's default
    sampling: SamplingParams
    stop: tuple[str, ...]
    stop_token_ids: tuple[int, ...]
    ignore_eos: bool
    stream: bool
    include_usage: bool


UTF8_BOM = b"\xef\xbb\xbf"


def parse_json(body: bytes) -> dict:
    """Strict UTF-8 JSON object; NaN/Infinity literals, 4,300+ digit numbers and deep nesting are 400s.

    One leading byte-order mark is ignored, as RFC 8259 section 8.1 allows: editors and some
    shells (Windows PowerShell 5's `Out-File`) write one, and the body is the same JSON without it."""
    body = body[len(UTF8_BOM):] if body.startswith(UTF8_BOM) else body
    try:
        data = json.loads(body.decode("utf-8"), parse_constant=_refuse_constant)
    except UnicodeDecodeError as e:
        raise APIError(400, f"request body is not valid UTF-8 (byte {e.start})", code="invalid_json") from None
    except RecursionError:
        raise APIError(400, f"request body is nested deeper than {MAX_DEPTH} levels", code="invalid_json") from None
    except ValueError as e:                  # JSONDecodeError, or an integer with too many digits
        raise APIError(400, f"request body is not valid JSON: {e}", code="invalid_json") from None
    if not isinstance(data, dict):
        raise APIError(400, "request body must be a JSON object", code="invalid_json")
    return data


def _refuse_constant(name: str):
    raise APIError(400, f"request body is not valid JSON: {name} is not a JSON number", code="invalid_json")


def check_tree(data) -> None:
    """Refuse nesting deeper than MAX_DEPTH and strings holding unpaired surrogates, naming where.

    Iterative, so no body can exhaust the interpreter's stack; surrogates (JSON escapes such as
    "\\ud800") are text that UTF-8 cannot carry: the tokenizer and the response encoder would fail.
    """
    stack = [(data, None, 1)]
    while stack:
        value, where, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise APIError(400, f"request body is nested deeper than {MAX_DEPTH} levels", where, "invalid_json")
        if isinstance(value, str):
            _check_text(value, where)
        elif isinstance(value, dict):
            for key, item in value.items():
                _check_text(key, where)
                stack.append((item, f"{where}.{key}" if where else key, depth + 1))
        elif isinstance(value, list):
            stack.extend((item, f"{where}[{i}]", depth + 1) for i, item in enumerate(value))


def _check_text(text: str, where: str | None) -> None:
    if text.isascii():
        return
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise APIError(400, f"{where or 'a key'} holds an unpaired UTF-16 surrogate at index {e.start}; "
                            "send valid Unicode text", where, "invalid_value") from None


def parse_request(data: dict, kind: str, served_model: str) -> CompletionSpec:
    check_tree(data)
    _check_model(data, served_model)
    for key, off in UNSUPPORTED.items():
        if data.get(key) is not None and not _is_off(data[key], off):
            raise APIError(400, f"'{key}' is not supported by this server", key, "unsupported")
    if _get(data, "n", int, 1) != 1:
        raise APIError(400, "only n=1 is supported", "n", "unsupported")
    max_tokens = _get(data, "max_tokens", int, None)
    if kind == "chat" and max_tokens is None:
        max_tokens = _get(data, "max_completion_tokens", int, None)
    if max_tokens is not None and max_tokens <= 0:
        raise APIError(400, f"max_tokens must be at least 1, got {max_tokens}", "max_tokens", "invalid_value")
    stream_options = _get(data, "stream_options", dict, None) or {}
    return CompletionSpec(
        kind=kind,
        prompt=_prompt(data) if kind == "completion" else None,
        messages=_messages(data) if kind == "chat" else None,
        max_tokens=max_tokens,
        sampling=_sampling(data),
        stop=_stop(data),
        stop_token_ids=tuple(_int_list(data, "stop_token_ids")),
        ignore_eos=_get(data, "ignore_eos", bool, False),
        stream=_get(data, "stream", bool, False),
        include_usage=_include_usage(stream_options),
    )


def _check_model(data: dict, served_model: str) -> None:
    model = _get(data, "model", str, None)
    if model is not None and model != served_model:
        raise APIError(404, f"The model '{model}' does not exist; this server serves '{served_model}'",
                       "model", "model_not_found")


def _sampling(data: dict) -> SamplingParams:
    temperature = _number(data, "temperature", 1.0, 0.0, 2.0)
    top_p = _number(data, "top_p", 1.0, 0.0, 1.0)
    if top_p == 0:
        raise APIError(400, "top_p must be in (0, 1]", "top_p", "invalid_value")
    top_k = _get(data, "top_k", int, -1)
    if top_k < -1:
        raise APIError(400, "top_k must be -1 or 0 (off) or >= 1", "top_k", "invalid_value")
    seed = _get(data, "seed", int, None)
    if seed is not None and not SEED_RANGE[0] <= seed <= SEED_RANGE[1]:
        raise APIError(400, "seed must be a 64-bit integer (-2**63 to 2**64-1)", "seed", "invalid_value")
    return SamplingParams(temperature=temperature, top_p=top_p, top_k=top_k or -1, seed=seed)


def _include_usage(stream_options: dict) -> bool:
    value = stream_options.get("include_usage")
    if value is not None and not isinstance(value, bool):
        raise APIError(400, "'stream_options.include_usage' must be a boolean", "stream_options.include_usage",
                       "invalid_type")
    return bool(value)


def _is_off(value, off: tuple) -> bool:
    # bool is an int in Python: True must not pass as 1, nor False as 0
    return any(type(value) is type(o) and value == o or _is_number(value) and _is_number(o) and value == o
               for o in off)


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _prompt(data: dict) -> str | tuple[int, ...]:
    prompt = data.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]                     # a batch of one
    if isinstance(prompt, str) and prompt:
        return prompt
    if isinstance(prompt, list) and prompt and all(_is_int(t) and t >= 0 for t in prompt):
        return tuple(prompt)
    if prompt is None:
        raise APIError(400, "'prompt' is required", "prompt", "missing_required_parameter")
    raise APIError(400, "'prompt' must be a non-empty string or a list of token ids (one prompt per request)",
                   "prompt", "invalid_type")


def _messages(data: dict) -> tuple[dict, ...]:
    messages = data.get("messages")
    if messages is None:
        raise APIError(400, "'messages' is required", "messages", "missing_required_parameter")
    if not isinstance(messages, list) or not messages:
        raise APIError(400, "'messages' must be a non-empty list", "messages", "invalid_type")
    return tuple(_message(m, i) for i, m in enumerate(messages))


def _message(message, i: int) -> dict:
    where = f"messages[{i}]"
    if not isinstance(message, dict):
        raise APIError(400, f"{where} must be an object", where, "invalid_type")
    role = message.get("role")
    if role not in ROLES:
        raise APIError(400, f"{where}.role must be one of {', '.join(ROLES)}", f"{where}.role", "invalid_value")
    return {"role": role, "content": _content(message.get("content"), f"{where}.content")}


def _content(content, where: str) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text"
                                         and isinstance(p.get("text"), str) for p in content):
        return "".join(p["text"] for p in content)
    raise APIError(400, f"{where} must be a string or a list of text parts", where, "invalid_type")


def _stop(data: dict) -> tuple[str, ...]:
    stop = data.get("stop")
    if stop is None:
        return ()
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop):
        raise APIError(400, "'stop' must be a non-empty string or a list of them", "stop", "invalid_type")
    if len(stop) > MAX_STOP_STRINGS:
        raise APIError(400, f"at most {MAX_STOP_STRINGS} stop strings", "stop", "invalid_value")
    return tuple(stop)


def _int_list(data: dict, key: str) -> list[int]:
    value = data.get(key)
    if value is None:
        return []
    if not isinstance(value, list) or not all(_is_int(v) and v >= 0 for v in value):
        raise APIError(400, f"'{key}' must be a list of non-negative integers", key, "invalid_type")
    return value


def _number(data: dict, key: str, default: float, low: float, high: float) -> float:
    value = data.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise APIError(400, f"'{key}' must be a number, got {type(value).__name__}", key, "invalid_type")
    if not low <= value <= high:
        raise APIError(400, f"'{key}' must be between {low} and {high}, got {value}", key, "invalid_value")
    return float(value)


def _get(data: dict, key: str, kind: type, default):
    value = data.get(key)
    if value is None:
        return default
    ok = _is_int(value) if kind is int else isinstance(value, kind)
    if not ok:
        raise APIError(400, f"'{key}' must be of type {kind.__name__}, got {type(value).__name__}",
                       key, "invalid_type")
    return value


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
