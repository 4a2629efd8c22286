"""The outermost layer of every HTTP request: key, size, counting, and no unhandled error.

A pure ASGI middleware (not Starlette's BaseHTTPMiddleware) so the handlers see the server's
own `receive`, which is how they notice a client going away. Anything a handler raises
becomes a JSON answer here: uvicorn never sees an exception, so it never closes the
keep-alive connection for the next request.
"""

from __future__ import annotations

import hmac
import json
import logging
import time

from starlette.requests import ClientDisconnect
from starlette.responses import JSONResponse

from serving.server.request_heads import FRAMING_ERROR
from serving.server.protocol import APIError

log = logging.getLogger("serving.server")


class ASCIIJSONResponse(JSONResponse):
    """JSON with non-ASCII escaped: valid for any Python str, lone surrogates included."""

    def render(self, content) -> bytes:
        return json.dumps(content, ensure_ascii=True, allow_nan=False, separators=(",", ":")).encode("ascii")


def error_response(e: APIError) -> JSONResponse:
    return ASCIIJSONResponse(e.body(), status_code=e.status, headers=e.headers())


ARRIVAL = "ddops.arrival"   # ASGI scope key: perf_counter() when the request arrived


class Guard:
    """ASGI middleware: `open_paths` need no key; everything else needs `Bearer api_key` when set."""

    def __init__(self, app, api_key: str | None, open_paths: tuple[str, ...], body_limit: int, count):
        self.app, self.api_key, self.open_paths, self.body_limit = app, api_key, open_paths, body_limit
        self.count = count                       # count(path, status)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        scope[ARRIVAL] = time.perf_counter()    # the request's headers are in: TTFT counts from here
        started: list[int] = []
        complete: list[bool] = []

        async def tracked_send(message):
            if message["type"] == "http.response.start":
                started.append(message["status"])
            elif message["type"] == "http.response.body" and not message.get("more_body", False):
                complete.append(True)
            await send(message)

        try:
            refusal = self._refusal(scope)
            if refusal is not None:
                await error_response(refusal)(scope, receive, tracked_send)
            else:
                await self.app(_as_get(scope), receive, tracked_send)
        except ClientDisconnect:
            pass
        except Exception as e:   # a bug, not bad input: JSON 500, the traceback to the log
            log.exception("unexpected error on %s", scope["path"])
            await _finish(e, started, scope, receive, tracked_send)
        self.count(scope["path"], outcome(scope, started, bool(complete)))

    def _refusal(self, scope) -> APIError | None:
        headers = dict(scope["headers"])
        if self.api_key and scope["path"] not in self.open_paths:
            problem = _key_problem([v for k, v in scope["headers"] if k == b"authorization"], self.api_key)
            if problem is not None:
                return problem
        declared = headers.get(b"content-length", b"")
        if declared.isdigit() and int(declared) > self.body_limit:
            return APIError(413, f"request body of {declared.decode()} bytes exceeds the limit of "
                                 f"{self.body_limit}", code="request_too_large")
        return None


def outcome(scope, started: list[int], complete: bool) -> int:
    """The status a request counts as: 400 when h11 refused its framing mid-body, 499 when the
    client left before the response was complete (a stream abandoned after its 200 included),
    else the status sent."""
    if scope.get(FRAMING_ERROR):
        return 400
    if not complete:
        return 499
    return started[0] if started else 499


def _key_problem(sent: list[bytes], api_key: str) -> APIError | None:
    """`Authorization: Bearer KEY`, the scheme in any case (RFC 9110 section 11.1); more than one
    Authorization header is refused, not resolved (a proxy may read the first, we the last)."""
    if len(sent) > 1:
        return APIError(400, "more than one Authorization header", code="invalid_request",
                        kind="invalid_request_error")
    scheme, _, token = (sent[0] if sent else b"").partition(b" ")
    right = hmac.compare_digest(token.strip(b" "), api_key.encode())       # constant time
    if scheme.lower() != b"bearer" or not right:
        return APIError(401, "invalid or missing API key (send 'Authorization: Bearer KEY')",
                        code="invalid_api_key", kind="authentication_error")
    return None


def _as_get(scope):
    """HEAD answers as GET does (RFC 9110 section 9.3.2); uvicorn drops the body, as its own
    scope still says HEAD."""
    return {**scope, "method": "GET"} if scope["method"] == "HEAD" else scope


async def _finish(e: Exception, started: list[int], scope, receive, send) -> None:
    try:
        if not started:
            error = APIError(500, f"internal error: {type(e).__name__}", code="internal_error", kind="server_error")
            await error_response(error)(scope, receive, send)
        else:                    # headers are out: end the body cleanly rather than reset
            await send({"type": "http.response.body", "body": b"", "more_body": False})
    except Exception:            # the response was already complete, or the client is gone
        log.debug("could not finish the response", exc_info=True)
