"""The client side of serving.bench.serve: a runtime subprocess and `openai` async clients.

Each client sends streaming chat requests one after another; a `Shot` records one request's
time to first token, the gaps between streamed chunks, the tokens the server counted and
whether the stream ended properly (a finish_reason, then the end of the stream).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from serving.tools.prompt_sets import numbered


@dataclass
class Shot:
    ttft: float = 0.0
    gaps: list[float] = field(default_factory=list)
    tokens: int = 0
    finish: str | None = None
    error: str | None = None        # "busy" for a 503 server_busy, else the error's text


class Server:
    """`python -m serving` on a loopback port for the length of a `with` block (or a given URL)."""

    def __init__(self, model: Path, port: int, threads: int, extra: list[str], url: str | None = None):
        self.model, self.port, self.threads, self.extra = model, port, threads, extra
        self.url = url or f"http://127.0.0.1:{port}"
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> "Server":
        if self.proc is None and self.url.endswith(f":{self.port}"):
            env = {**os.environ, "OMP_NUM_THREADS": str(self.threads)}
            self.proc = subprocess.Popen([sys.executable, "-m", "serving", "--model-path", str(self.model),
                                          "--port", str(self.port), "--log-level", "warning", *self.extra],
                                         env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            if self.proc is not None:
                self._wait_ready()
            with urllib.request.urlopen(f"{self.url}/v1/models", timeout=10) as r:
                self.name = json.load(r)["data"][0]["id"]
        except BaseException:
            self.__exit__()         # a server that never became usable is not left running
            raise
        return self

    def __exit__(self, *exc) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(timeout=30)
            self.proc = None

    def _wait_ready(self, timeout: float = 300) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}")
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.5)
        raise RuntimeError("server did not become ready")

    def cpu_s(self) -> float:
        """CPU seconds (user + system, all threads) the server process has used so far."""
        if self.proc is None:
            return 0.0
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def info(self) -> dict:
        """/server_info (unkeyed: the benchmark's own server has no API key)."""
        with urllib.request.urlopen(f"{self.url}/server_info", timeout=10) as r:
            return json.load(r)

    def rss_bytes(self) -> int:
        """Resident memory of the server process (Linux /proc)."""
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        return 0


SERIALS = itertools.count()      # every request of a benchmark process gets its own number


async def one(client, model: str, index: int, max_tokens: int) -> Shot:
    import openai

    shot, began = Shot(), time.perf_counter()
    last = began
    try:
        stream = await client.chat.completions.create(
            model=model, stream=True, max_tokens=max_tokens, temperature=0,
            messages=[{"role": "user", "content": numbered(next(SERIALS), index)}],
            stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
        async for chunk in stream:
            now = time.perf_counter()
            if chunk.usage is not None:
                shot.tokens = chunk.usage.completion_tokens
            for choice in chunk.choices:
                if choice.delta.content:
                    if not shot.ttft:
                        shot.ttft = now - began
                    else:
                        shot.gaps.append(now - last)
                    last = now
                shot.finish = choice.finish_reason or shot.finish
        if shot.finish is None:
            shot.error = "truncated"
    except openai.APIStatusError as e:
        shot.error = "busy" if e.status_code == 503 else f"{e.status_code}: {e.message}"
    except openai.APIError as e:
        shot.error = f"{type(e).__name__}: {e}"
    return shot


def _client(url: str, connections: int):
    import httpx
    import openai

    limits = httpx.Limits(max_connections=connections, max_keepalive_connections=connections)
    return openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=600,
                              http_client=httpx.AsyncClient(limits=limits, timeout=600))


async def run_level(server: Server, concurrency: int, per_client: int, max_tokens: int) -> list[Shot]:
    """`concurrency` clients, each sending `per_client` requests back to back."""
    client = _client(server.url, concurrency)

    async def worker(w: int) -> list[Shot]:
        return [await one(client, server.name, w * per_client + k, max_tokens) for k in range(per_client)]

    async with client:
        return [s for shots in await asyncio.gather(*(worker(w) for w in range(concurrency))) for s in shots]


async def soak(server: Server, clients: int, seconds: float, max_tokens: int) -> dict:
    """`clients` clients sending requests back to back for `seconds`; every answer accounted for."""
    client, deadline = _client(server.url, clients), time.monotonic() + seconds
    rss_start = server.rss_bytes() if server.proc else 0

    async def worker(w: int) -> list[Shot]:
        shots = []
        while time.monotonic() < deadline:
            shots.append(await one(client, server.name, w + len(shots), max_tokens))
            if shots[-1].error == "busy":
                await asyncio.sleep(1)      # the server's Retry-After
        return shots

    async def sample_rss(samples: list[int]) -> None:
        while time.monotonic() < deadline:
            await asyncio.sleep(seconds / 6)
            samples.append(server.rss_bytes())

    began, rss = time.perf_counter(), []
    async with client:
        sampler = asyncio.ensure_future(sample_rss(rss)) if server.proc else None
        shots = [s for group in await asyncio.gather(*(worker(w) for w in range(clients))) for s in group]
        if sampler:
            sampler.cancel()
    wall = time.perf_counter() - began
    complete = [s for s in shots if s.error is None and s.tokens == max_tokens]
    return {"clients": clients, "seconds": wall, "requests": len(shots), "complete": len(complete),
            "busy_503": sum(s.error == "busy" for s in shots),
            "truncated": sum(s.error == "truncated" or (s.error is None and s.tokens != max_tokens) for s in shots),
            "other_errors": sum(s.error not in (None, "busy", "truncated") for s in shots),
            "error_samples": sorted({s.error for s in shots if s.error not in (None, "busy")})[:5],
            "output_tok_s": sum(s.tokens for s in complete) / wall,
            "rss_start_bytes": rss_start, "rss_samples_bytes": rss,
            "rss_end_bytes": server.rss_bytes() if server.proc else 0}
