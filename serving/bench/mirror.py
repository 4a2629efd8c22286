"""What mirroring costs production and what it reports (issue 25; docs/mirror.md).

    python -m serving.bench.mirror [--target MODEL --draft DRAFT] [--requests 16]
                                   [--per-block 10] [--rounds 12] [--clients 64] [--soak-s 20]

Starts, on loopback with an API key, production (plain decoding, --enable-mirror) and a DDTree
shadow of the same tiny random checkpoint (serving.tools.tiny, tiny_draft), then prints:
1. `--requests` greedy client requests to production with the tap on: requests the shadow
   compared, token equality, the shadow's accepted length, TTFT, ITL and tokens/s.
2. production's p50/p99 with the tap on and off in alternating blocks of `--per-block`
   sequential requests (`--rounds` of each), first toward a live shadow, then, after the shadow
   is killed (SIGKILL) in the middle of a block, toward the dead one; production's errors, the
   added p99 and p50 (on - off); and the tap's own cost per request (Tap.offer, timed in this
   process).
3. a soak: `--clients` concurrent clients for `--soak-s` seconds with the tap on toward a fresh
   shadow that cannot keep up: both processes' RSS at start, peak and end, and the tap's and the
   sink's counts (the queues stay at their bounds; the excess is dropped and counted).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import statistics
import tempfile
import threading
import time
from pathlib import Path

import httpx

from serving.tools.local_server import ServerProcess

KEY = "mirror-bench-key"
AUTH = {"Authorization": f"Bearer {KEY}"}


def chat(client: httpx.Client, i: int) -> tuple[float, bool]:
    body = {"model": "tiny", "messages": [{"role": "user", "content": f"Count to {i % 7 + 3}."}],
            "max_tokens": 8, "temperature": 0}
    start = time.perf_counter()
    try:
        ok = client.post("/v1/chat/completions", json=body).status_code == 200
    except httpx.HTTPError:
        ok = False
    return time.perf_counter() - start, ok


def p(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round((len(ordered) - 1) * q / 100))]


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


class Pair:
    def __init__(self, root: Path, target: Path | None, draft: Path | None):
        from serving.tools.tiny import write_tiny
        from serving.tools.tiny_draft import write_tiny_draft
        self.root, self.target = root, target or write_tiny(root / "target", arch="llama")
        self.draft = draft or root / "draft"
        if draft is None:
            write_tiny_draft(self.target, self.draft)
        self.env = {**os.environ, "DDOPS_API_KEY": KEY}
        self.production = self.start("production", "--enable-mirror")
        self.shadow = self.start_shadow()

    def start(self, name: str, *flags: str) -> ServerProcess:
        return ServerProcess(self.target, self.root / f"{name}.log", "--served-model-name", "tiny",
                             "--log-level", "warning", *flags, env=self.env).wait_ready(180)

    def start_shadow(self) -> ServerProcess:
        return self.start(f"shadow-{time.monotonic_ns()}", "--speculative-algorithm", "DDTREE",
                          "--speculative-draft-model-path", str(self.draft))

    def tap(self, on: bool) -> None:
        if on:
            httpx.put(self.production.url + "/mirror", json={"url": self.shadow.url, "api_key": KEY},
                      headers=AUTH).raise_for_status()
        else:
            httpx.delete(self.production.url + "/mirror", headers=AUTH).raise_for_status()

    def stats(self, which: ServerProcess, path: str) -> dict:
        return httpx.get(which.url + path, headers=AUTH, timeout=10).json()

    def stop(self) -> None:
        for s in (self.production, self.shadow):
            if s.process.poll() is None:
                s.stop()


def mirrored_figures(pair: Pair, n: int) -> None:
    pair.tap(True)
    with httpx.Client(base_url=pair.production.url, headers=AUTH, timeout=60) as client:
        errors = sum(not chat(client, i)[1] for i in range(n))
    deadline = time.monotonic() + 120
    while (s := pair.stats(pair.shadow, "/mirror/stats"))["compared"] + s["failed"] < n and time.monotonic() < deadline:
        time.sleep(0.2)
    det, shadow = s["deterministic"], s["shadow"]
    print(f"1. {n} greedy client requests ({errors} errors): the shadow compared {s['compared']} "
          f"(failed {s['failed']}, dropped {s['dropped']}); deterministic {det['requests']}, equal "
          f"{det['equal']}, token equality {det['token_equality']}; shadow accepted length "
          f"{shadow['accept_length']:.3f}, TTFT p50 {shadow['ttft_p50_s'] * 1000:.1f} ms, ITL p50 "
          f"{(shadow['itl_p50_s'] or 0) * 1000:.1f} ms, {shadow['tokens_per_s']:.1f} tokens/s")


def block(pair: Pair, n: int, tap: bool | None, kill_at: int | None = None) -> tuple[list[float], int]:
    """`n` sequential requests to production; tap None: leave it as it is."""
    if tap is not None:
        pair.tap(tap)
    latencies, errors = [], 0
    with httpx.Client(base_url=pair.production.url, headers=AUTH, timeout=60) as client:
        for i in range(n):
            if i == kill_at:
                os.kill(pair.shadow.process.pid, signal.SIGKILL)
                pair.shadow.process.wait()
            seconds, ok = chat(client, i)
            latencies.append(seconds)
            errors += not ok
    return latencies, errors


def alternate(pair: Pair, name: str, per_block: int, rounds: int) -> None:
    """Blocks of `per_block` requests, tap on and off in turn, so drifting load hits both alike."""
    runs = {"on": [], "off": []}
    errors = dict.fromkeys(runs, 0)
    for _ in range(rounds):
        for state in ("on", "off"):
            latencies, failed = block(pair, per_block, state == "on")
            runs[state] += latencies
            errors[state] += failed
    off = p(runs["off"], 99)
    for state, values in runs.items():
        print(f"2. {name}, tap {state:3}: {len(values)} requests, {errors[state]} errors, p50 "
              f"{statistics.median(values) * 1000:.1f} ms, p99 {p(values, 99) * 1000:.1f} ms")
    print(f"   {name}: added p99 {(p(runs['on'], 99) - off) * 1000:+.1f} ms, added p50 "
          f"{(statistics.median(runs['on']) - statistics.median(runs['off'])) * 1000:+.1f} ms")


def latency_figures(pair: Pair, per_block: int, rounds: int) -> None:
    alternate(pair, "shadow alive", per_block, rounds)
    latencies, failed = block(pair, 2 * per_block, True, kill_at=per_block)
    print(f"2. shadow killed (SIGKILL) after {per_block} of {2 * per_block} requests: {failed} production "
          f"errors, p99 {p(latencies, 99) * 1000:.1f} ms")
    alternate(pair, "shadow dead", per_block, rounds)
    print(f"   production's tap after the kill: {pair.stats(pair.production, '/mirror')}")
    print(f"   Tap.offer: {offer_cost_us():.2f} us per finished request (in-process, 100000 calls)")


def offer_cost_us(calls: int = 100_000) -> float:
    from serving.engine import StopRule
    from serving.engine.events import Finished
    from serving.engine.stats import Usage
    from serving.sampling import SamplingParams
    from serving.server.mirror import Tap

    async def run() -> float:
        tap = Tap(True)
        tap.target = ("127.0.0.1", 9)     # active, but no sender: the queue fills, then drops
        finished = Finished("x", (1, 2, 3), "length", Usage(3, 3, 1, 2, 0.0, 0.0))
        rule, sampling = StopRule(8), SamplingParams(temperature=0)
        start = time.perf_counter()
        for _ in range(calls):
            tap.offer([1, 2, 3], sampling, rule, finished)
        return (time.perf_counter() - start) / calls * 1e6
    return asyncio.run(run())


def soak(pair: Pair, clients: int, seconds: float) -> None:
    pair.shadow = pair.start_shadow()
    pair.tap(True)
    pids = {"production": pair.production.process.pid, "shadow": pair.shadow.process.pid}
    start = {k: rss_mib(v) for k, v in pids.items()}
    peak = dict(start)
    stop = time.monotonic() + seconds
    counts = {"ok": 0, "errors": 0}

    def client_loop(c: int) -> None:
        with httpx.Client(base_url=pair.production.url, headers=AUTH, timeout=120) as client:
            i = c
            while time.monotonic() < stop:
                ok = chat(client, i)[1]
                counts["ok" if ok else "errors"] += 1
                i += clients
    threads = [threading.Thread(target=client_loop, args=(c,)) for c in range(clients)]
    for t in threads:
        t.start()
    while any(t.is_alive() for t in threads):
        peak = {k: max(peak[k], rss_mib(v)) for k, v in pids.items()}
        time.sleep(0.5)
    end = {k: rss_mib(v) for k, v in pids.items()}
    tap, sink = pair.stats(pair.production, "/mirror"), pair.stats(pair.shadow, "/mirror/stats")
    print(f"3. soak: {clients} clients for {seconds:.0f} s: {counts['ok']} answered, {counts['errors']} errors")
    for k in pids:
        print(f"   {k} RSS: start {start[k]:.0f} MiB, peak {peak[k]:.0f} MiB, end {end[k]:.0f} MiB")
    print(f"   tap: {tap}")
    print(f"   sink: received {sink['received']}, dropped {sink['dropped']}, failed {sink['failed']}, "
          f"compared {sink['compared']}, samples {len(sink['samples'])}")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(prog="python -m serving.bench.mirror", description=__doc__.split("\n")[0])
    ap.add_argument("--target", type=Path, help="checkpoint both serve (default: a tiny random one)")
    ap.add_argument("--draft", type=Path, help="the shadow's DDTree draft (default: a tiny random one)")
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--per-block", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--soak-s", type=float, default=20.0)
    args = ap.parse_args(argv)
    print(f"machine: {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}")
    with tempfile.TemporaryDirectory(prefix="ddops-mirror-") as tmp:
        pair = Pair(Path(tmp), args.target, args.draft)
        try:
            mirrored_figures(pair, args.requests)
            latency_figures(pair, args.per_block, args.rounds)
            soak(pair, args.clients, args.soak_s)
        finally:
            pair.stop()


if __name__ == "__main__":
    main()
