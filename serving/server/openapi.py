"""The OpenAPI document (/openapi.json): request and response shapes, and every error status.

The handlers parse bodies themselves (serving.server.protocol: OpenAI-style 400s naming the
parameter, body size limits), so these models only describe; `install` adds the request
schemas to the document. Keep them in step with protocol.py: schemathesis tests the server
against this document (tests/serving/test_fuzz.py).
"""

from __future__ import annotations

from typing import Annotated, Literal, Union

from fastapi import FastAPI
from pydantic import BaseModel, Field
from pydantic.json_schema import models_json_schema

from serving.server.protocol import MAX_STOP_STRINGS, ROLES, SEED_RANGE

TokenId = Annotated[int, Field(ge=0)]
Text = Annotated[str, Field(min_length=1)]


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorBody(BaseModel):
    error: ErrorDetail


class StreamOptions(BaseModel):
    include_usage: bool = False


class Sampling(BaseModel):
    """Fields both endpoints share. Unsupported OpenAI fields are accepted only at their 'off' value."""
    model: str | None = Field(None, description="the served model name; another name is a 404")
    max_tokens: Annotated[int, Field(ge=1)] | None = None
    temperature: Annotated[float, Field(ge=0, le=2)] | None = None
    top_p: Annotated[float, Field(gt=0, le=1)] | None = None
    top_k: Annotated[int, Field(ge=-1)] | None = None
    seed: Annotated[int, Field(ge=SEED_RANGE[0], le=SEED_RANGE[1])] | None = None
    stop: Union[Text, Annotated[list[Text], Field(max_length=MAX_STOP_STRINGS)], None] = None
    stop_token_ids: list[TokenId] | None = None
    ignore_eos: bool | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    n: Literal[1] | None = None
    logprobs: Literal[False] | None = None
    top_logprobs: Literal[0] | None = None
    presence_penalty: Literal[0] | None = None
    frequency_penalty: Literal[0] | None = None
    logit_bias: Annotated[dict[str, float], Field(max_length=0)] | None = None


class CompletionRequest(Sampling):
    prompt: Union[Text, Annotated[list[TokenId], Field(min_length=1)],
                  Annotated[list[Text], Field(min_length=1, max_length=1)],
                  Annotated[list[Annotated[list[TokenId], Field(min_length=1)]], Field(min_length=1, max_length=1)]]
    echo: Literal[False] | None = None
    best_of: Literal[1] | None = None
    suffix: Literal[""] | None = None


class TextPart(BaseModel):
    type: Literal["text"]
    text: str


class Message(BaseModel):
    role: Literal[ROLES]
    content: Union[str, list[TextPart], None] = None


class ChatCompletionRequest(Sampling):
    messages: Annotated[list[Message], Field(min_length=1)]
    max_completion_tokens: Annotated[int, Field(ge=1)] | None = None
    response_format: dict | None = Field(None, description="only {'type': 'text'}")
    tools: Annotated[list, Field(max_length=0)] | None = None
    tool_choice: Literal["none"] | None = None


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: None
    finish_reason: Literal["stop", "length", "abort"]


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage


class AssistantMessage(BaseModel):
    role: Literal["assistant"]
    content: str


class ChatChoice(BaseModel):
    index: int
    message: AssistantMessage
    logprobs: None
    finish_reason: Literal["stop", "length", "abort"]


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage


class HealthBody(BaseModel):
    status: str


def _errors(*statuses: int) -> dict:
    return {s: {"model": ErrorBody} for s in statuses}


KEYED = (401,)
HEALTH = {"responses": {200: {"model": HealthBody}, 503: {"model": HealthBody}}}
HEALTH_GENERATE = {"responses": {200: {"description": "a probe generated tokens (status, tokens, rounds)"},
                                 503: {"description": "loading, or the probe failed (status, reason)"}}}
MODELS = {"responses": _errors(*KEYED)}
SERVER_INFO = {"responses": _errors(*KEYED)}
METRICS = {"responses": {200: {"content": {"text/plain": {}}, "description": "Prometheus text format"},
                         **_errors(*KEYED)}}
REQUESTS = {"completion": (CompletionRequest, CompletionResponse),
            "chat": (ChatCompletionRequest, ChatCompletionResponse)}


def completion_route(kind: str) -> dict:
    request, response = REQUESTS[kind]
    ok = {"model": response, "description": "the whole answer, or with stream=true server-sent events",
          "content": {"text/event-stream": {"schema": {"type": "string"}}}}
    return {"responses": {200: ok, **_errors(400, 401, 404, 413, 499, 500, 503)},
            "openapi_extra": {"requestBody": {"required": True, "content": {
                "application/json": {"schema": {"$ref": f"#/components/schemas/{request.__name__}"}}}}}}


def install(app: FastAPI) -> None:
    """Generate the document once, adding the request models to its components."""
    def openapi() -> dict:
        if app.openapi_schema is None:
            schema = FastAPI.openapi(app)
            _, defs = models_json_schema([(m, "validation") for m, _ in REQUESTS.values()],
                                         ref_template="#/components/schemas/{model}")
            schema.setdefault("components", {}).setdefault("schemas", {}).update(defs.get("$defs", {}))
            app.openapi_schema = schema
        return app.openapi_schema
    app.openapi = openapi
