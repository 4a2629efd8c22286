"""Mirroring production's requests to a shadow (docs/mirror.md).

Tap, on production (only with --enable-mirror; set at run time by `PUT /mirror`): after each
finished generation a record (prompt ids, sampling, stop rule, production's answer ids and
finish reason) is appended to a bounded queue; one sender task posts records to the shadow's
`POST /mirror/records`, fire-and-forget. The request path only appends: a full queue drops and
counts, and a shadow that refuses or times out is left alone for BACKOFF_S (records offered
meanwhile are dropped and counted), so a slow, failing or stopped shadow costs production one
deque append per request.

Sink, on any bundled runtime: `POST /mirror/records` queues a record (bounded; 429 when full),
WORKERS regenerate through this engine and tally the comparison (mirror_tally.py);
`GET /mirror/stats` reports it. Records stay between the two hosts; samples (texts) are kept
only for records production marked, bounded and redacted.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
from collections import deque
from dataclasses import asdict
from urllib.parse import urlsplit

from fastapi import FastAPI, Request

from serving.engine import StopRule
from serving.sampling import SamplingParams
from serving.server.generation import Admitted
from serving.server.mirror_tally import Tally
from serving.server.protocol import APIError, parse_json

log = logging.getLogger("serving.mirror")

TAP_QUEUE = 256         # records waiting to be sent on production
SINK_QUEUE = 64         # records waiting to be regenerated on the shadow
WORKERS = 4             # regenerations in flight on the shadow (the engine batches them)
SEND_TIMEOUT_S = 2.0    # connect + send + status line, per record
BACKOFF_S = 1.0         # after a failed send, drop records for this long
GENERATE_TIMEOUT_S = 300.0
# The sender serializes records on production's event loop: JSON of 100k ids takes 12 ms on a
# loaded 2-CPU machine, 16k ids about 2 ms; longer records are not mirrored (counted).
MAX_RECORD_IDS = 16384


class Tap:
    """Production's side: a bounded queue of records and one sender."""

    def __init__(self, allowed: bool):
        self.allowed = allowed
        self.target: tuple[str, int] | None = None
        self.api_key: str | None = None
        self.sample = 0.0
        self.queue: deque = deque()
        self.wake = asyncio.Event()
        self.sender: asyncio.Task | None = None
        self.counts = {"offered": 0, "sent": 0, "dropped_full": 0, "dropped_backoff": 0,
                       "refused_full": 0, "rejected": 0, "skipped_long": 0, "failed": 0}
        self.backoff_until = 0.0

    @property
    def active(self) -> bool:
        return self.target is not None

    def offer(self, prompt_ids, sampling: SamplingParams, rule: StopRule, finished) -> None:
        """On the event loop, once per finished production request: O(1), never waits."""
        if not self.active:
            return
        self.counts["offered"] += 1
        if len(prompt_ids) + len(finished.token_ids) > MAX_RECORD_IDS:
            self.counts["skipped_long"] += 1
        elif time.monotonic() < self.backoff_until:
            self.counts["dropped_backoff"] += 1
        elif len(self.queue) >= TAP_QUEUE:
            self.counts["dropped_full"] += 1
        else:
            self.queue.append((prompt_ids, sampling, rule, finished, random.random() < self.sample))
            self.wake.set()

    def start(self, url: str, api_key: str | None, sample: float) -> None:
        parts = urlsplit(url)
        if parts.scheme != "http" or not parts.hostname or not parts.port:
            raise APIError(400, f"url must be http://HOST:PORT, got {url!r}", "url", "invalid_value")
        self.target, self.api_key, self.sample = (parts.hostname, parts.port), api_key, sample
        self.backoff_until = 0.0          # a new target gets its first record tried at once
        self.queue.clear()
        self.counts = dict.fromkeys(self.counts, 0)
        if self.sender is None or self.sender.done():
            self.sender = asyncio.ensure_future(self._send_all())

    def stop(self) -> None:
        self.target = None
        self.queue.clear()
        if self.sender is not None:
            self.sender.cancel()
            self.sender = None

    def to_dict(self) -> dict:
        host = f"http://{self.target[0]}:{self.target[1]}" if self.target else None
        return {"allowed": self.allowed, "target": host, "sample": self.sample,
                "queued": len(self.queue), "queue_limit": TAP_QUEUE, **self.counts}

    async def _send_all(self) -> None:
        while True:
            await self.wake.wait()
            self.wake.clear()
            while self.queue and self.target:
                status = await self._send(record_body(*self.queue.popleft()))
                if status in (200, 202):
                    self.counts["sent"] += 1
                elif status == 429:       # the shadow is up but its queue is full: it counted the drop
                    self.counts["refused_full"] += 1
                elif status is not None and 400 <= status < 500:   # this record (too large, ...), not the shadow
                    self.counts["rejected"] += 1
                else:
                    self.counts["failed"] += 1
                    self.backoff_until = time.monotonic() + BACKOFF_S
                    self.counts["dropped_backoff"] += len(self.queue)
                    self.queue.clear()

    async def _send(self, body: bytes) -> int | None:
        """One POST on its own connection: the status, None when it failed before one came."""
        host, port = self.target
        auth = f"Authorization: Bearer {self.api_key}\r\n" if self.api_key else ""
        head = (f"POST /mirror/records HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
                f"{auth}Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode()
        writer = None
        try:
            async with asyncio.timeout(SEND_TIMEOUT_S):
                reader, writer = await asyncio.open_connection(host, port)
                writer.write(head + body)
                await writer.drain()
                status = await reader.readline()
            return int(status.split(b" ")[1])
        except (OSError, asyncio.TimeoutError, IndexError, ValueError):
            return None
        finally:
            if writer is not None:
                writer.close()


def record_body(prompt_ids, sampling: SamplingParams, rule: StopRule, finished, sample: bool) -> bytes:
    return json.dumps({"prompt_ids": list(prompt_ids), "sampling": asdict(sampling),
                       "max_new_tokens": rule.max_new_tokens, "stop_strings": list(rule.stop_strings),
                       "stop_ids": sorted(rule.stop_ids), "answer_ids": list(finished.token_ids),
                       "finish_reason": finished.finish_reason, "sample": sample}).encode()


def parse_record(data: dict) -> dict:
    """A record as the sink uses it; APIError 400 naming the field when it is malformed.
    Production's answer is either `answer_ids` (with `finish_reason`) or, from a relay that saw
    only the answer's text (a streamed vLLM chat), `answer_text`: exactly one of them."""
    def ints(key: str) -> tuple[int, ...]:
        value = data.get(key)
        if not isinstance(value, list) or not all(type(i) is int and i >= 0 for i in value):
            raise APIError(400, f"{key} must be a list of token ids", key, "invalid_value")
        return tuple(value)
    if not isinstance(data, dict):
        raise APIError(400, "a mirror record is a JSON object", None, "invalid_value")
    try:
        sampling = SamplingParams(**data["sampling"])
        rule = StopRule(int(data["max_new_tokens"]), tuple(map(str, data.get("stop_strings", ()))),
                        frozenset(ints("stop_ids")))
    except (KeyError, TypeError, ValueError) as e:
        raise APIError(400, f"malformed mirror record: {e}", None, "invalid_value") from None
    prompt = ints("prompt_ids")
    if not prompt or rule.max_new_tokens < 1:
        raise APIError(400, "a mirror record needs prompt ids and max_new_tokens >= 1", None, "invalid_value")
    has_ids, has_text = "answer_ids" in data, "answer_text" in data
    if has_ids == has_text:
        raise APIError(400, "a mirror record has exactly one of answer_ids and answer_text",
                       "answer_text" if has_text else "answer_ids", "invalid_value")
    text = data["answer_text"] if has_text else None
    if has_text and not isinstance(text, str):
        raise APIError(400, "answer_text must be a string", "answer_text", "invalid_value")
    reason = data.get("finish_reason")
    if reason is not None and not isinstance(reason, str):
        raise APIError(400, "finish_reason must be a string", "finish_reason", "invalid_value")
    return {"prompt": list(prompt), "sampling": sampling, "rule": rule,
            "answer": ints("answer_ids") if has_ids else None, "text": text,
            "reason": reason[:64] if reason else "unknown", "sample": data.get("sample") is True}


class Sink:
    """The shadow's side: a bounded queue, WORKERS regenerating, one Tally."""

    def __init__(self, state):
        self.state = state
        self.queue: asyncio.Queue = asyncio.Queue(maxsize=SINK_QUEUE)
        self.tally = Tally()
        self.workers: list[asyncio.Task] = []

    def put(self, record: dict) -> None:
        self.tally.received += 1
        if not self.workers:
            self.workers = [asyncio.ensure_future(self._work()) for _ in range(WORKERS)]
        try:
            self.queue.put_nowait(record)
        except asyncio.QueueFull:
            self.tally.dropped += 1
            raise APIError(429, "the shadow's mirror queue is full; record dropped", None,
                           "mirror_queue_full", kind="server_error") from None

    async def _work(self) -> None:
        while True:
            record = await self.queue.get()
            try:
                await self._regenerate(record)
            except (APIError, asyncio.TimeoutError, RuntimeError) as e:
                self.tally.failed += 1
                log.debug("mirror record failed: %s", e)

    async def _regenerate(self, r: dict) -> None:
        engine = self.state.engine
        if engine is None:
            raise RuntimeError("the model is still loading")
        finished = await Admitted(engine, r["prompt"], r["sampling"], r["rule"]).result(GENERATE_TIMEOUT_S)
        deterministic = r["sampling"].greedy or r["sampling"].seed is not None
        decode = self.state.tokenizer.decode
        if r["answer"] is not None:
            self.tally.add(deterministic, r["answer"], r["reason"], finished.token_ids, finished.finish_reason,
                           finished.usage)
        else:   # production's text only: compare with the text this server would send a client
            self.tally.add_text(deterministic, r["text"], finished.text, len(finished.token_ids),
                                finished.finish_reason, finished.usage)
        if r["sample"]:
            production = decode(list(r["answer"])) if r["answer"] is not None else r["text"]
            self.tally.keep_sample(decode(r["prompt"]), production, finished.text,
                                   (self.state.args.api_key or "",))


def recorder(state, prompt_ids, sampling: SamplingParams, rule: StopRule):
    """The `record` callback of a production request: metrics, then the tap when it is on."""
    observe, tap = state.metrics.observe, state.mirror_tap
    if tap is None or not tap.active:
        return observe

    def record(finished) -> None:
        observe(finished)
        tap.offer(prompt_ids, sampling, rule, finished)
    return record


def install(app: FastAPI, state) -> None:
    """Routes of both sides; all of them need the API key (they are not open paths)."""

    @app.put("/mirror", include_in_schema=False)
    async def start_tap(request: Request):
        if not state.args.enable_mirror:
            raise APIError(403, "mirroring is off on this server: start it with --enable-mirror "
                                "(profile service.mirror: true)", None, "mirror_disabled")
        data = parse_json(await request.body())
        sample = data.get("sample", 0.0)
        if not isinstance(sample, (int, float)) or not 0 <= sample <= 1:
            raise APIError(400, "sample must be a fraction 0..1", "sample", "invalid_value")
        tap = state.mirror_tap = state.mirror_tap or Tap(True)
        tap.start(str(data.get("url")), data.get("api_key"), float(sample))
        return tap.to_dict()

    @app.delete("/mirror", include_in_schema=False)
    async def stop_tap():
        if state.mirror_tap is not None:
            state.mirror_tap.stop()
        return {"stopped": True}

    @app.get("/mirror", include_in_schema=False)
    async def tap_stats():
        tap = state.mirror_tap
        return tap.to_dict() if tap else Tap(bool(state.args.enable_mirror)).to_dict()

    @app.post("/mirror/records", status_code=202, include_in_schema=False)
    async def take_record(request: Request):
        record = parse_record(parse_json(await request.body()))
        state.mirror_sink = state.mirror_sink or Sink(state)
        state.mirror_sink.put(record)
        return {"queued": True}

    @app.get("/mirror/stats", include_in_schema=False)
    async def sink_stats():
        return (state.mirror_sink.tally if state.mirror_sink else Tally()).to_dict()
