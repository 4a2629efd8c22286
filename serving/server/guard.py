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

        async def tracked_send(message):
            if message["type"] == "http.response.start":
                started.append(message["status"])
            await send(message)

        try:
            refusal = self._refusal(scope)
            if refusal is not None:
                await error_response(refusal)(scope, receive, tracked_send)
            else:
                await self.app(scope, receive, tracked_send)
        except ClientDisconnect:
            started.append(499)
        except Exception as e:   # a bug, not bad input: JSON 500, the traceback to the log
            log.exception("unexpected error on %s", scope["path"])
            await _finish(e, started, scope, receive, tracked_send)
        self.count(scope["path"], started[0] if started else 499)

    def _refusal(self, scope) -> APIError | None:
        headers = dict(scope["headers"])
        if self.api_key and scope["path"] not in self.open_paths:
            sent = headers.get(b"authorization", b"")
            if not hmac.compare_digest(sent, f"Bearer {self.api_key}".encode()):   # constant time
                return APIError(401, "invalid or missing API key (send 'Authorization: Bearer KEY')",
                                code="invalid_api_key", kind="authentication_error")
        declared = headers.get(b"content-length", b"")
        if declared.isdigit() and int(declared) > self.body_limit:
            return APIError(413, f"request body of {declared.decode()} bytes exceeds the limit of "
                                 f"{self.body_limit}", code="request_too_large")
        return None


async def _finish(e: Exception, started: list[int], scope, receive, send) -> None:
    try:
        if not started:
            error = APIError(500, f"internal error: {type(e).__name__}", code="internal_error", kind="server_error")
            await error_response(error)(scope, receive, send)
        else:                    # headers are out: end the body cleanly rather than reset
            await send({"type": "http.response.body", "body": b"", "more_body": False})
    except Exception:            # the response was already complete, or the client is gone
        log.debug("could not finish the response", exc_info=True)
