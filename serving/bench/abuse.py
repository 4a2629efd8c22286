"""Keyed request latency, quiet and under abuse, on one loopback runtime (issue 16's measure).

    python -m serving.bench.abuse [--model-path DIR] [--requests 20] [--rounds 2] [--slow 300] [--probes 60]

Starts the runtime with an API key, times sequential keyed chat requests with nothing else
running, then again while `--slow` connections trickle never-ending headers (reconnecting
whenever the server drops them) and `--probes` unkeyed clients call /health_generate back to
back; the two phases alternate `--rounds` times. Prints p50/p95 of both phases and their ratio (goal: p95 within
1.5x of quiet), and what the abusers saw. Loopback only; bounded by the request counts.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import statistics
import time
from collections import Counter
from pathlib import Path

import httpx

from serving.tools.local_server import LocalServer

KEY = "abuse-key"
CHAT = {"messages": [{"role": "user", "content": "Name three rivers in Europe."}], "max_tokens": 16,
        "temperature": 0, "ignore_eos": True}


def keyed_latencies(url: str, count: int) -> list[float]:
    out = []
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {KEY}"}, timeout=120) as client:
        for _ in range(count):
            began = time.perf_counter()
            response = client.post("/v1/chat/completions", json=CHAT)
            response.raise_for_status()
            out.append(time.perf_counter() - began)
    return out


def p95(values: list[float]) -> float:
    return statistics.quantiles(values, n=20, method="inclusive")[-1]


class Abusers:
    """Slow-header connections and unkeyed probe loops, in a child process of their own so they
    never hold the measuring client's interpreter lock (they stand in for other machines)."""

    def __init__(self, port: int, slow: int, probes: int, nice: int):
        self.port, self.slow, self.probes, self.nice = port, slow, probes, nice
        self.results: multiprocessing.Queue = multiprocessing.Queue()
        self.stop = multiprocessing.Event()
        self.process = multiprocessing.Process(target=self._child, daemon=True)
        self.seen: Counter = Counter()

    def __enter__(self) -> "Abusers":
        self.process.start()
        time.sleep(2.0)                       # let the connections and the probe loops start
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.seen.update(self.results.get(timeout=60))
        self.process.join(timeout=30)

    def _child(self) -> None:
        os.nice(self.nice)
        seen: Counter = Counter()
        asyncio.run(self._main(seen))
        self.results.put(seen)

    async def _main(self, seen: Counter) -> None:
        tasks = [asyncio.ensure_future(self._slow_connection(seen)) for _ in range(self.slow)]
        tasks += [asyncio.ensure_future(self._probe_loop(seen)) for _ in range(self.probes)]
        while not self.stop.is_set():
            await asyncio.sleep(0.2)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _slow_connection(self, seen: Counter) -> None:
        while True:
            try:
                reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
                seen["slow connections opened"] += 1
                writer.write(b"GET /health HTTP/1.1\r\nHost: x\r\n")
                while not reader.at_eof():     # one more header line a second, never the blank line
                    await asyncio.sleep(1.0)
                    writer.write(b"X-Slow: 1\r\n")
                    await writer.drain()
            except OSError:
                pass
            seen["slow connections dropped by the server"] += 1

    async def _probe_loop(self, seen: Counter) -> None:
        """Unkeyed GET /health_generate on one keep-alive connection, back to back."""
        while True:
            try:
                reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
                while True:
                    writer.write(b"GET /health_generate HTTP/1.1\r\nHost: x\r\n\r\n")
                    head = await reader.readuntil(b"\r\n\r\n")
                    length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
                    await reader.readexactly(length)
                    seen[f"unkeyed /health_generate {head.split()[1].decode()}"] += 1
            except (OSError, asyncio.IncompleteReadError, IndexError, ValueError) as e:
                seen[f"unkeyed /health_generate {type(e).__name__}"] += 1
                await asyncio.sleep(0.1)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(prog="python -m serving.bench.abuse", description=__doc__.splitlines()[0])
    ap.add_argument("--model-path", type=Path, help="checkpoint (default: a tiny random one)")
    ap.add_argument("--requests", type=int, default=20)
    ap.add_argument("--slow", type=int, default=300)
    ap.add_argument("--probes", type=int, default=60)
    ap.add_argument("--rounds", type=int, default=2, help="quiet/abused phases alternate this many times")
    ap.add_argument("--threads", type=int, default=1, help="torch threads of the runtime")
    ap.add_argument("--abuser-nice", type=int, default=0, help="niceness of the abusing process")
    args = ap.parse_args(argv)
    quiet, loaded, seen = [], [], Counter()
    per_phase = max(2, args.requests // args.rounds)
    with LocalServer(args.model_path, ["--api-key", KEY], threads=args.threads) as server:
        keyed_latencies(server.url, 2)                         # warm-up
        for _ in range(args.rounds):          # alternate, so drift in the machine's load hits both
            quiet += keyed_latencies(server.url, per_phase)
            with Abusers(server.port, args.slow, args.probes, args.abuser_nice) as abusers:
                loaded += keyed_latencies(server.url, per_phase)
            seen.update(abusers.seen)
        info = httpx.get(server.url + "/server_info", headers={"Authorization": f"Bearer {KEY}"}).json()
    print(f"keyed chat ({CHAT['max_tokens']} tokens), {len(quiet)} sequential requests per phase, "
          f"{args.rounds} rounds")
    print(f"  quiet:  p50 {statistics.median(quiet):.3f} s  p95 {p95(quiet):.3f} s")
    print(f"  abused: p50 {statistics.median(loaded):.3f} s  p95 {p95(loaded):.3f} s "
          f"({args.slow} slow connections, {args.probes} unkeyed /health_generate loops)")
    print(f"  p95 ratio abused/quiet: {p95(loaded) / p95(quiet):.2f} (goal <= 1.5)")
    for what, count in sorted(seen.items()):
        print(f"  {what}: {count}")
    print(f"  generations the engine ran in all: {info['internal_states'][0]['num_requests_total']}")


if __name__ == "__main__":
    main()
