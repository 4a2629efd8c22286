"""A short request's latency under a crowd of long generations, against its latency alone.

    python -m serving.bench.crowd [--model DIR] [--long 20] [--long-tokens 400] [--short 20]
        [--short-tokens 4] [--server-arg=--context-length=512 ...]

One `python -m serving` on loopback (default: the project's tiny llama, written to a temporary
folder, served with --context-length 512; its pool is the start-up rule's, 32 sequences of 512
rows, unless a --server-arg=--max-total-tokens=N sets a cap: 512 holds one long sequence, the
pool before the rule). First `--short` chat requests of `--short-tokens` tokens, one after another,
alone; then `--long` streams of `--long-tokens` tokens (ignore_eos, T=0) are started, and once
every one of them is streaming, the same short requests again, one after another, while the
crowd runs. Prints each phase's p50/p99 end-to-end latency and the ratio of the p99s measured
in this run (issue 26's goal: under 20 streams of 400 tokens, at most 3x), and the machine's
load average before and after. No API key: the benchmark's server has none.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from pathlib import Path

import httpx

from serving.bench.loadgen import Server


def parse(argv=None):
    ap = argparse.ArgumentParser(prog="python -m serving.bench.crowd", description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, help="checkpoint directory (default: a tiny llama)")
    ap.add_argument("--long", type=int, default=20)
    ap.add_argument("--long-tokens", type=int, default=400)
    ap.add_argument("--short", type=int, default=20)
    ap.add_argument("--short-tokens", type=int, default=4)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--port", type=int, default=30931)
    ap.add_argument("--server-arg", action="append", default=None,
                    help="extra server flag, repeatable (default: --context-length=512)")
    return ap.parse_args(argv)


def body(model: str, max_tokens: int, stream: bool, i: int) -> dict:
    return {"model": model, "messages": [{"role": "user", "content": f"Say something, number {i}."}],
            "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True, "stream": stream}


async def short_latencies(client: httpx.AsyncClient, model: str, n: int, tokens: int) -> list[float]:
    """Seconds per request, end to end, one after another."""
    out = []
    for i in range(n):
        began = time.perf_counter()
        reply = await client.post("/v1/chat/completions", json=body(model, tokens, False, i))
        reply.raise_for_status()
        out.append(time.perf_counter() - began)
    return out


async def long_stream(client: httpx.AsyncClient, model: str, tokens: int, i: int, started: list) -> None:
    """One long streamed generation; its index goes into `started` at its first SSE line."""
    async with client.stream("POST", "/v1/chat/completions", json=body(model, tokens, True, 1000 + i)) as reply:
        reply.raise_for_status()
        async for line in reply.aiter_lines():
            if line.startswith("data: ") and i not in started:
                started.append(i)


async def gauges(client: httpx.AsyncClient) -> dict:
    """The engine's running and queued requests and KV pool rows, from /metrics."""
    wanted = {"serving_num_running_reqs": "running", "serving_queue_depth": "queued",
              "serving_kv_pool_tokens": "pool rows"}
    out = {}
    for line in (await client.get("/metrics")).text.splitlines():
        name, _, value = line.partition(" ")
        if name in wanted:
            out[wanted[name]] = int(float(value))
    return out


async def measure(url: str, model: str, opts) -> tuple[list[float], list[float], dict]:
    """(latencies alone, latencies under the crowd, the engine's gauges as the second phase began
    and the seconds the crowd took)."""
    limits = httpx.Limits(max_connections=opts.long + 8)
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as client:
        await short_latencies(client, model, 2, opts.short_tokens)          # warm-up
        alone = await short_latencies(client, model, opts.short, opts.short_tokens)
        started: list = []
        began = time.perf_counter()
        crowd = [asyncio.create_task(long_stream(client, model, opts.long_tokens, i, started))
                 for i in range(opts.long)]
        while len(started) < opts.long:        # every long stream's response has begun: all are in the engine
            await asyncio.sleep(0.005)
        state = await gauges(client)
        under = await short_latencies(client, model, opts.short, opts.short_tokens)
        await asyncio.gather(*crowd)
    state["crowd seconds"] = round(time.perf_counter() - began, 1)    # all long streams, start to last token
    return alone, under, state


def p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]


def main(argv=None) -> int:
    opts = parse(argv)
    os.environ.pop("DDOPS_API_KEY", None)      # the benchmark's own server is unkeyed
    extra = opts.server_arg if opts.server_arg is not None else ["--context-length=512"]
    with tempfile.TemporaryDirectory() as tmp:
        model = opts.model
        if model is None:
            from serving.tools.tiny import write_tiny

            model = write_tiny(Path(tmp) / "tiny-llama", "llama")
        with Server(model, opts.port, opts.threads, extra) as server:
            load = os.getloadavg()
            alone, under, running = asyncio.run(measure(server.url, server.name, opts))
    print(f"model {model.name}, server flags {' '.join(extra) or '(none)'}; short requests of "
          f"{opts.short_tokens} tokens, {opts.short} per phase; crowd: {opts.long} streams of {opts.long_tokens}")
    for label, values in (("alone", alone), ("under the crowd", under)):
        print(f"{label:>16}: p50 {1000 * statistics.median(values):8.1f} ms   p99 {1000 * p99(values):8.1f} ms")
    print("engine when the short requests began: " + ", ".join(f"{k} {v}" for k, v in running.items()
                                                            if k != "crowd seconds"))
    print(f"the crowd's {opts.long} streams took {running['crowd seconds']} s from start to last token")
    print(f"p99 under the crowd / p99 alone: {p99(under) / p99(alone):.2f}x (goal <= 3x)")
    print("load average (1, 5, 15 min) before: {:.2f} {:.2f} {:.2f}; after: {:.2f} {:.2f} {:.2f}".format(
        *load, *os.getloadavg()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
