"""The HTTP surface (docs/contracts.md section 2): FastAPI routes over one Engine.

Handlers validate with `protocol`, tokenize (`prompting`: long text off the event loop), hand
a GenerationRequest to the engine and bridge its worker-thread events into asyncio. Any bad input becomes a 4xx OpenAI-style
error; nothing a client sends can stop the server.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.exceptions import HTTPException as StarletteHTTPException

from serving import __version__, memory
from serving.engine import Delta, Engine, Failed, StopRule
from serving.engine.process import EngineProcess
from serving.sampling import SamplingParams
from serving.server import mirror, openapi
from serving.server import responses as R
from serving.server.faults import Faults
from serving.server.generation import Admitted, HealthProbe
from serving.server.guard import ARRIVAL, Guard, error_response
from serving.server.metrics import Metrics
from serving.server.prompting import Prompts
from serving.server.protocol import DEFAULT_MAX_TOKENS, APIError, CompletionSpec, parse_json, parse_request

log = logging.getLogger("serving.server")


@dataclass
class AppState:
    args: object                       # resolved ServerArgs
    tokenizer: object
    engine: Engine | EngineProcess | None = None   # set once the model is loaded (the server's: a process)
    eos_ids: frozenset[int] = frozenset()
    vocab_size: int = 0
    metrics: Metrics = field(default_factory=Metrics)
    faults: Faults = field(default_factory=Faults)  # injected by tests only (serving.server.faults)
    prompts: Prompts | None = None     # set by create_app
    started: float = field(default_factory=time.time)
    mirror_tap: object = None          # serving.server.mirror.Tap once PUT /mirror set a target
    mirror_sink: object = None         # serving.server.mirror.Sink once a record arrived

    @property
    def ready(self) -> bool:
        return self.engine is not None


def open_paths(args) -> tuple[str, ...]:
    """Paths served without the API key: health checks, and /metrics unless --metrics-require-api-key."""
    return ("/health", "/health_generate") + (() if args.metrics_require_api_key else ("/metrics",))


def create_app(state: AppState) -> FastAPI:
    state.metrics.mirror_tally = lambda: state.mirror_sink.tally if state.mirror_sink else None
    app = FastAPI(title="ddops serving", version=__version__, docs_url=None, redoc_url=None,
                  openapi_url="/openapi.json")
    app.state.serving = state
    state.prompts = state.prompts or Prompts(state)
    args = state.args
    app.add_middleware(Guard, api_key=args.api_key, open_paths=open_paths(args),
                       body_limit=args.max_request_bytes, count=request_counter(state))

    @app.exception_handler(APIError)
    async def api_error(_, e: APIError):
        return error_response(e)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_, e: StarletteHTTPException):
        return error_response(APIError(e.status_code, str(e.detail),
                                       code="not_found" if e.status_code == 404 else None))

    _install_routes(app, state)
    mirror.install(app, state)
    openapi.install(app)
    return app


def request_counter(state: AppState):
    """count(path, status): serving_requests_total, unknown paths as "other" (bounded labels)."""
    def count(path: str, status: int) -> None:
        state.metrics.requests.labels(path if path in KNOWN_PATHS else "other", str(status)).inc()
    return count


async def _read_json(request: Request, limit: int) -> dict:
    body = bytearray()
    async for part in request.stream():     # also bounds bodies sent without Content-Length
        body += part
        if len(body) > limit:
            raise APIError(413, f"request body exceeds the limit of {limit} bytes", code="request_too_large")
    return parse_json(bytes(body))


# The prefill commits the first token, each further one a decoder round: with a speculative
# method, draft + verify rounds, so the probe exercises the drafter and the verifier, and its
# acceptance rests on a dozen or more rounds (tokens within a block of the end draft less and
# are not counted), never on one lucky round.
HEALTH_TOKENS = 32
KNOWN_PATHS = ("/health", "/health_generate", "/server_info", "/metrics", "/v1/models",
               "/v1/completions", "/v1/chat/completions", "/openapi.json")


def _install_routes(app: FastAPI, state: AppState) -> None:
    args = state.args
    probe = HealthProbe(lambda: _health_generation(state), args.health_generate_interval)

    @app.get("/health", **openapi.HEALTH)
    async def health():
        return JSONResponse({"status": "ok" if state.ready else "loading"}, status_code=200 if state.ready else 503)

    @app.get("/health_generate", **openapi.HEALTH_GENERATE)
    async def health_generate():
        if not state.ready:
            return JSONResponse({"status": "loading"}, status_code=503)
        status, body = await probe.outcome()
        return JSONResponse(body, status_code=status)

    @app.get("/v1/models", **openapi.MODELS)
    async def models():
        return {"object": "list", "data": [{"id": args.served_model_name, "object": "model",
                                            "created": int(state.started), "owned_by": "ddops",
                                            "root": args.model_path, "max_model_len": args.context_length}]}

    @app.get("/server_info", **openapi.SERVER_INFO)
    async def server_info():
        stats = state.engine.stats.snapshot() if state.ready else {
            "avg_spec_accept_length": 1.0, "last_gen_throughput": 0.0, "num_requests_total": 0}
        snapshot = state.engine.snapshot() if state.ready else None
        runner = snapshot.info if snapshot else None
        info = {**args.public(), **(runner.speculative if runner else {}), "version": __version__,
                "status": "ok" if state.ready else "loading", "internal_states": [stats],
                "engine_pid": snapshot.pid if snapshot else None}
        if runner:  # measured tensors beside the prediction from config.json (serving.memory)
            info["memory"] = memory.report(runner.memory, args)
            info["kernels"] = runner.kernels
            info["prefix_cache"] = runner.prefix_cache   # a dense target's, unless --disable-radix-cache
        return info

    @app.get("/metrics", **openapi.METRICS)
    async def metrics():
        return Response(state.metrics.render(state.engine), media_type=CONTENT_TYPE_LATEST)

    @app.post("/v1/completions", **openapi.completion_route("completion"))
    async def completions(request: Request):
        return await _complete(state, request, "completion")

    @app.post("/v1/chat/completions", **openapi.completion_route("chat"))
    async def chat_completions(request: Request):
        return await _complete(state, request, "chat")


async def _health_generation(state: AppState) -> dict:
    # a chat turn, the shape drafts are trained on, so the forced round shows real acceptance
    probe = _chat_or_plain(state.tokenizer, "Hello") or [0]
    rule = StopRule(max_new_tokens=HEALTH_TOKENS)     # no stop ids: EOS cannot end it before a round
    admitted = Admitted(state.engine, probe, SamplingParams(temperature=0), rule, probe=True)
    finished = await admitted.result(timeout=state.args.health_generate_timeout)
    # accept_length: tokens per round of the probe's rounds, each verifying the method's widest
    # setting even when an adaptive runtime prefers plain decoding; spec_rounds: how many (those
    # that drafted a whole block), so the gate can tell a figure from one lucky round
    usage = finished.usage
    return {"status": "ok", "tokens": list(finished.token_ids), "rounds": usage.rounds,
            "accept_length": usage.draft_accept_length or 1.0, "spec_rounds": usage.trials}


async def _complete(state: AppState, request: Request, kind: str):
    spec = parse_request(await _read_json(request, state.args.max_request_bytes), kind,
                         state.args.served_model_name)
    if not state.ready:
        raise APIError(503, "the model is still loading", code="loading", kind="server_error", retry_after=5)
    await state.faults.before_generation(APIError)
    prompt_ids = await state.prompts.ids(spec)
    rule = _stop_rule(state, spec, prompt_ids)
    model = state.args.served_model_name
    # admitted before any response starts: a full queue is a 503, never a 200 with an empty stream
    admitted = Admitted(state.engine, prompt_ids, spec.sampling, rule, request.receive,
                        arrival=request.scope.get(ARRIVAL),
                        record=mirror.recorder(state, prompt_ids, spec.sampling, rule))
    if spec.stream:
        return StreamingResponse(_stream(state, spec, admitted, model), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache"})
    finished = await admitted.result()
    return R.final_body(kind, R.new_id(kind), model, finished)


def _stop_rule(state: AppState, spec: CompletionSpec, prompt_ids: list[int]) -> StopRule:
    room = state.args.context_length - len(prompt_ids)
    if spec.max_tokens is not None and spec.max_tokens > room:
        raise APIError(400, f"prompt ({len(prompt_ids)} tokens) + max_tokens ({spec.max_tokens}) exceeds "
                            f"the context of {state.args.context_length} tokens", "max_tokens",
                       "context_length_exceeded")
    max_new = spec.max_tokens or min(room, DEFAULT_MAX_TOKENS[spec.kind])
    stop_ids = set(spec.stop_token_ids) | (set() if spec.ignore_eos else state.eos_ids)
    return StopRule(max_new_tokens=max_new, stop_strings=spec.stop, stop_ids=frozenset(stop_ids))


async def _stream(state: AppState, spec: CompletionSpec, admitted: Admitted, model: str):
    kind, rid = spec.kind, R.new_id(spec.kind)
    if kind == "chat":
        yield R.sse(R.chunk(kind, rid, model, None, first=True))
    async for event in admitted.deltas():
        if isinstance(event, Failed):
            yield R.sse(APIError(500, event.message, code="generation_failed", kind="server_error").body())
        elif isinstance(event, Delta):
            yield R.sse(R.chunk(kind, rid, model, event.text))
        else:
            yield R.sse(R.chunk(kind, rid, model, None, finish_reason=event.finish_reason))
            if spec.include_usage:
                yield R.sse(R.usage_chunk(kind, rid, model, event.usage))
    yield R.sse("[DONE]")


def _chat_or_plain(tokenizer, text: str) -> list[int]:
    """`text` as one user turn through the chat template, or plainly when the model has none."""
    try:
        return tokenizer.encode_chat([{"role": "user", "content": text}])
    except ValueError:
        return tokenizer.encode(text, prompt=True)
