"""Fuzz the runtime over HTTP: schemathesis cases from its own /openapi.json, then hostile bodies.

    python -m serving.tools.fuzz [--url URL --api-key KEY | --model-path DIR] [--examples N] [--seed S]

Without --url it starts a runtime on loopback (the tiny random checkpoint unless --model-path).
Every case goes over one keep-alive connection; a case fails when the server answers 5xx,
resets or closes the connection, answers a status its OpenAPI document does not declare, or
a body that does not match the document's models (errors, whole answers, complete streams).
Prints the tally; exit status 1 when anything failed. `make test` runs a short seeded run
(tests/serving/test_fuzz.py); `make fuzz` a long one.
"""

from __future__ import annotations

import argparse
import http.client
import json
import sys
from collections import Counter
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import httpx
import schemathesis
from hypothesis import HealthCheck, given, seed as hypothesis_seed, settings
from schemathesis import GenerationMode
from schemathesis.core import NotSet

from pydantic import ValidationError

from serving.server.openapi import ChatCompletionResponse, CompletionResponse, ErrorBody
from serving.tools.hostile import hostile_bodies

DEFAULT_KEY = "fuzz-key"
ANSWERS = {"/v1/completions": CompletionResponse, "/v1/chat/completions": ChatCompletionResponse}


@dataclass
class Tally:
    cases: int = 0
    statuses: Counter = field(default_factory=Counter)
    failures: list[str] = field(default_factory=list)

    def failed(self, what: str, path: str, body: bytes) -> None:
        self.failures.append(f"{what}: {path} {body[:200]!r}")

    def summary(self) -> str:
        codes = ", ".join(f"{s}: {n}" for s, n in sorted(self.statuses.items()))
        server = sum(n for s, n in self.statuses.items() if s >= 500)
        resets = sum(1 for f in self.failures if f.startswith(("reset", "closed")))
        return f"{self.cases} cases, {server} server errors, {resets} resets/closes ({codes})"


class Wire:
    """One keep-alive HTTP/1.1 connection; notices when the server drops it."""

    def __init__(self, url: str, key: str):
        parts = urlsplit(url)
        self.host, self.port, self.key = parts.hostname, parts.port, key
        self.conn = http.client.HTTPConnection(self.host, self.port, timeout=120)

    def send(self, tally: Tally, method: str, path: str, body: bytes | None, declared: set[int]) -> None:
        headers = {"Authorization": f"Bearer {self.key}", "Content-Type": "application/json"}
        tally.cases += 1
        try:
            self.conn.request(method, path, body=body, headers=headers)
            response = self.conn.getresponse()
            answer = response.read()
        except (OSError, http.client.HTTPException) as e:
            tally.failed(f"reset ({type(e).__name__})", path, body or b"")
            self.conn.close()
            self.conn = http.client.HTTPConnection(self.host, self.port, timeout=120)
            return
        tally.statuses[response.status] += 1
        if response.status >= 500:
            tally.failed(f"HTTP {response.status}", path, body or b"")
        elif declared and response.status not in declared:
            tally.failed(f"undeclared HTTP {response.status}", path, body or b"")
        elif problem := nonconforming(path, response.status, response.getheader("content-type", ""), answer):
            tally.failed(f"HTTP {response.status} body {problem}", path, body or b"")
        if self.conn.sock is None:              # the server asked to close: the next client pays
            tally.failed("closed", path, body or b"")


def nonconforming(path: str, status: int, content_type: str, answer: bytes) -> str | None:
    """Why the answer does not match the OpenAPI document's models, or None."""
    if content_type.startswith("text/event-stream"):
        return None if answer.endswith(b"data: [DONE]\n\n") else "is an unfinished stream"
    model = ErrorBody if status >= 400 else ANSWERS.get(path)
    if model is None or status == 503 and path == "/health_generate":
        return None
    try:
        model.model_validate_json(answer)
    except ValidationError as e:
        return f"does not match {model.__name__}: {str(e).splitlines()[0]}"
    return None


def _quiet(examples: int):
    return settings(max_examples=examples, database=None, deadline=None,
                    suppress_health_check=list(HealthCheck), print_blob=False)


def schema_cases(wire: Wire, url: str, tally: Tally, examples: int, seed: int) -> None:
    document = httpx.get(url + "/openapi.json", headers={"Authorization": f"Bearer {wire.key}"}).json()
    schema = schemathesis.openapi.from_dict(document)
    for result in schema.get_all_operations():
        operation = result.ok()
        declared = {int(s) for s in operation.definition.raw.get("responses", {}) if s.isdigit()}
        modes = [GenerationMode.POSITIVE] + ([GenerationMode.NEGATIVE] if operation.method.upper() == "POST" else [])
        for mode in modes:
            _run_operation(wire, tally, operation, mode, declared, examples if operation.method.upper() == "POST"
                           else max(2, examples // 10), seed)


def _run_operation(wire, tally, operation, mode, declared, examples, seed) -> None:
    @_quiet(examples)
    @given(operation.as_strategy(generation_mode=mode))
    def run(case):
        body = None if isinstance(case.body, NotSet) else _encode(case.body)
        wire.send(tally, case.method.upper(), case.formatted_path, body, declared)

    _seeded(run, seed)


def _encode(body) -> bytes:
    # negative cases may be raw bytes (a non-JSON payload), or hold bytes inside
    if isinstance(body, bytes):
        return body
    return json.dumps(body, default=lambda o: o.decode("latin-1") if isinstance(o, bytes) else repr(o)).encode()


def hostile_cases(wire: Wire, tally: Tally, examples: int, seed: int) -> None:
    @_quiet(examples)
    @given(hostile_bodies())
    def run(case):
        path, body = case
        wire.send(tally, "POST", path, body, {200, 400, 404, 413, 503})

    _seeded(run, seed)


def _seeded(test, seed: int) -> None:
    hypothesis_seed(seed)(test)()


def fuzz(url: str, key: str, examples: int, seed: int) -> Tally:
    tally, wire = Tally(), Wire(url, key)
    schema_cases(wire, url, tally, examples, seed)
    hostile_cases(wire, tally, examples * 4, seed)
    return tally


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(prog="python -m serving.tools.fuzz", description=__doc__.splitlines()[0])
    ap.add_argument("--url", help="a running runtime (default: start one on loopback)")
    ap.add_argument("--api-key", default=DEFAULT_KEY)
    ap.add_argument("--model-path", help="checkpoint for the started runtime (default: a tiny random one)")
    ap.add_argument("--examples", type=int, default=500, help="cases per operation and mode (x4 hostile bodies)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    if args.url:
        tally = fuzz(args.url.rstrip("/"), args.api_key, args.examples, args.seed)
    else:
        from pathlib import Path

        from serving.tools.local_server import LocalServer
        model = Path(args.model_path) if args.model_path else None
        with LocalServer(model, ["--api-key", args.api_key, "--context-length", "256",
                                  "--health-generate-interval", "0"]) as server:
            tally = fuzz(server.url, args.api_key, args.examples, args.seed)
    for failure in tally.failures[:20]:
        print(failure)
    print(tally.summary())
    sys.exit(1 if tally.failures else 0)


if __name__ == "__main__":
    main()
