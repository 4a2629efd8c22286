"""Replay one prompt set to two OpenAI-compatible endpoints and compare the answers.

Each endpoint is measured in its own phase (production first, then shadow) so the two never
compete for the same CPU or GPU while timed. Requests are greedy (temperature 0), streamed
(time to first token), bounded in count, concurrency and time. Only HTTP here; arithmetic is
in stats.py, judgement in verdict.py.

Every request asks for its token ids with `return_token_ids: true`: vLLM then puts each chunk's
new ids in `choices[].token_ids` (vLLM 0.32, entrypoints/openai/chat_completion/protocol.py);
the bundled runtime ignores the field and streams text only. The accepted length comes from
whichever source the endpoint answers: `/server_info` (bundled, SGLang), else the spec-decode
counters on `/metrics` (vLLM), read before and after the endpoint's phase.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import asdict, dataclass
from typing import Sequence

import httpx

from ddops import exits
from ddops import server_info, spec_metrics
from ddops.rollout.shadow.prompts import Prompt
from ddops.rollout.shadow.stats import (Agreement, EndpointSummary, Sample, agree, summarize,
                                 token_equality)

MAX_COUNT = 1000
MAX_CONCURRENCY = 32


@dataclass(frozen=True)
class Endpoint:
    name: str  # "production" or "shadow"
    url: str  # http://ADDR:PORT
    model: str | None = None  # served model name; None: the first of /v1/models
    api_key: str | None = None


class SettingsError(exits.BadInput, ValueError):
    """A replay bound out of range: one line naming the option."""


@dataclass(frozen=True)
class Settings:
    count: int = 12
    concurrency: int = 2
    max_tokens: int = 32
    timeout_s: float = 120.0  # per request

    def __post_init__(self) -> None:
        if not 1 <= self.count <= MAX_COUNT:
            raise SettingsError(f"--count: must be 1..{MAX_COUNT}, got {self.count}")
        if not 1 <= self.concurrency <= MAX_CONCURRENCY:
            raise SettingsError(f"--concurrency: must be 1..{MAX_CONCURRENCY}, got {self.concurrency}")
        if not 1 <= self.max_tokens <= 4096:
            raise SettingsError(f"--max-tokens: must be 1..4096, got {self.max_tokens}")


@dataclass(frozen=True)
class Comparison:
    settings: Settings
    production: EndpointSummary
    shadow: EndpointSummary
    agreements: tuple[Agreement, ...]
    samples: dict  # endpoint name -> tuple[Sample, ...], in prompt order
    token_equality: float  # matched / compared positions, 0..1
    prompts_equal: int

    def to_dict(self) -> dict:
        return {
            "settings": asdict(self.settings),
            "token_equality": self.token_equality,
            "prompts_equal": self.prompts_equal,
            "prompts": len(self.agreements),
            "production": self.production.to_dict(),
            "shadow": self.shadow.to_dict(),
            "per_prompt": [_prompt_row(a, p, s) for a, p, s in
                           zip(self.agreements, self.samples["production"], self.samples["shadow"])],
        }


def _prompt_row(agreement: Agreement, production: Sample, shadow: Sample) -> dict:
    row = asdict(agreement)
    for name, s in (("production", production), ("shadow", shadow)):
        row[name] = {"text": s.text, "completion_tokens": s.completion_tokens,
                     "prompt_tokens": s.prompt_tokens,
                     "latency_s": s.latency_s, "ttft_s": s.ttft_s, "error": s.error}
    return row


def compare(production: Endpoint, shadow: Endpoint, prompts: Sequence[Prompt],
            settings: Settings) -> Comparison:
    """Replay the first `settings.count` prompts (cycling the set if it is shorter)."""
    chosen = chosen_prompts(prompts, settings.count)
    prod_samples, prod_wall, prod_accept = phase(production, chosen, settings)
    shadow_samples, shadow_wall, shadow_accept = phase(shadow, chosen, settings)
    agreements = tuple(agree(a, b) for a, b in zip(prod_samples, shadow_samples))
    return Comparison(
        settings=settings,
        production=summarize("production", prod_samples, prod_wall, prod_accept),
        shadow=summarize("shadow", shadow_samples, shadow_wall, shadow_accept),
        agreements=agreements,
        samples={"production": tuple(prod_samples), "shadow": tuple(shadow_samples)},
        token_equality=token_equality(agreements),
        prompts_equal=sum(a.equal for a in agreements))


def chosen_prompts(prompts: Sequence[Prompt], count: int) -> list[Prompt]:
    """The first `count` prompts, cycling the set when it is shorter (repeats named `id#n`)."""
    return [Prompt(f"{p.id}#{i // len(prompts)}" if i >= len(prompts) else p.id, p.text)
            for i, p in ((i, prompts[i % len(prompts)]) for i in range(count))]


def phase(endpoint: Endpoint, prompts: Sequence[Prompt],
          settings: Settings) -> tuple[list[Sample], float, float | None]:
    """One endpoint's replay: samples, wall time, and its accepted length over the replay."""
    before = spec_counters(endpoint)
    samples, wall_s = asyncio.run(replay(endpoint, prompts, settings))
    return samples, wall_s, accept_length(endpoint, before)


async def replay(endpoint: Endpoint, prompts: Sequence[Prompt],
                 settings: Settings) -> tuple[list[Sample], float]:
    """All prompts to one endpoint with at most `concurrency` in flight; returns samples and wall time."""
    gate = asyncio.Semaphore(settings.concurrency)
    async with httpx.AsyncClient(base_url=endpoint.url, headers=_headers(endpoint),
                                 timeout=settings.timeout_s) as client:
        start = time.perf_counter()
        try:
            model = endpoint.model or await _served_model(client)
        except (httpx.HTTPError, ValueError, KeyError, IndexError) as exc:
            reason = f"/v1/models: {type(exc).__name__}: {exc}"
            return [_failed(p, start, reason) for p in prompts], time.perf_counter() - start

        async def one(prompt: Prompt) -> Sample:
            async with gate:
                return await _ask(client, model, prompt, settings)

        start = time.perf_counter()
        samples = await asyncio.gather(*(one(p) for p in prompts))
        return list(samples), time.perf_counter() - start


def _headers(endpoint: Endpoint) -> dict:
    return {"Authorization": f"Bearer {endpoint.api_key}"} if endpoint.api_key else {}


async def _served_model(client: httpx.AsyncClient) -> str:
    response = await client.get("/v1/models")
    response.raise_for_status()
    return response.json()["data"][0]["id"]


async def _ask(client: httpx.AsyncClient, model: str, prompt: Prompt, settings: Settings) -> Sample:
    body = {"model": model, "messages": [{"role": "user", "content": prompt.text}],
            "temperature": 0, "max_tokens": settings.max_tokens, "stream": True,
            "stream_options": {"include_usage": True}, "return_token_ids": True}
    start = time.perf_counter()
    stream = _Stream()
    try:
        async with client.stream("POST", "/v1/chat/completions", json=body) as response:
            if response.status_code != 200:
                detail = (await response.aread()).decode(errors="replace")[:200]
                return _failed(prompt, start, f"HTTP {response.status_code}: {detail}")
            async for line in response.aiter_lines():
                if stream.feed(line, time.perf_counter() - start):
                    break
    except (httpx.HTTPError, ValueError) as exc:
        return _failed(prompt, start, f"{type(exc).__name__}: {exc}")
    return stream.sample(prompt.id, time.perf_counter() - start)


def _failed(prompt: Prompt, start: float, error: str) -> Sample:
    return Sample(prompt.id, "", None, 0, time.perf_counter() - start, None, error)


class _Stream:
    """Accumulates one SSE chat-completion stream."""

    def __init__(self) -> None:
        self.parts: list[str] = []
        self.chars = 0
        self.token_ids: list[int] | None = None
        self.spans: list[tuple[int, int]] = []  # per token id: its chunk's text [start, end)
        self.usage: dict = {}
        self.chunks = 0
        self.ttft_s: float | None = None

    def feed(self, line: str, elapsed_s: float) -> bool:
        """Takes one SSE line; True at `data: [DONE]`."""
        if not line.startswith("data:"):
            return False
        data = line[5:].strip()
        if data == "[DONE]":
            return True
        chunk = json.loads(data)
        if chunk.get("usage"):
            self.usage = chunk["usage"]
        for choice in chunk.get("choices", []):
            self._take(choice, elapsed_s)
        return False

    def _take(self, choice: dict, elapsed_s: float) -> None:
        start = self.chars
        content = (choice.get("delta") or {}).get("content")
        if content:
            self.parts.append(content)
            self.chars += len(content)
            self.chunks += 1
            if self.ttft_s is None:
                self.ttft_s = elapsed_s
        ids = choice.get("token_ids")
        if ids:
            self.token_ids = (self.token_ids or []) + list(ids)
            self.spans += [(start, self.chars)] * len(ids)

    def sample(self, prompt_id: str, latency_s: float) -> Sample:
        ids = tuple(self.token_ids) if self.token_ids is not None else None
        tokens = self.usage.get("completion_tokens")
        if tokens is None:
            tokens = len(ids) if ids is not None else self.chunks
        return Sample(prompt_id, "".join(self.parts), ids, tokens, latency_s, self.ttft_s,
                      token_ends=settled_ends(self.spans, self.chars) if ids is not None else None,
                      prompt_tokens=self.usage.get("prompt_tokens"))


def settled_ends(spans: Sequence[tuple[int, int]], length: int) -> tuple[int, ...]:
    """Per token, the end of the first chunk at or after it that added text: a token whose own
    chunk added none (an incomplete UTF-8 byte, EOS) is settled by what follows it; trailing
    ones get length + 1, past any common prefix, so they match only when the texts are equal."""
    ends, settled = [], length + 1
    for start, end in reversed(spans):
        if end > start:
            settled = end
        ends.append(settled)
    return tuple(reversed(ends))


def spec_counters(endpoint: Endpoint) -> spec_metrics.SpecCounters | str:
    with _client(endpoint) as client:
        return spec_metrics.read(client, timeout=10)


def accept_length(endpoint: Endpoint, before: spec_metrics.SpecCounters | str) -> float | None:
    """The endpoint's mean accepted length: /server_info's where it reports one (the server's
    running mean), else its /metrics spec-decode counters over the replay (`before` the counts
    read before it); None when neither says (a plain vLLM has no spec-decode counters)."""
    with _client(endpoint) as client:
        length = server_info.accept_length(server_info.read_or_empty(client, timeout=10))
        if length is not None or isinstance(before, str):
            return length
        after = spec_metrics.read(client, timeout=10)
    return after.minus(before).accept_length if isinstance(after, spec_metrics.SpecCounters) else None


def _client(endpoint: Endpoint) -> httpx.Client:
    return httpx.Client(base_url=endpoint.url, headers=_headers(endpoint), trust_env=False)
