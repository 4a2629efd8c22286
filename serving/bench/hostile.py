"""A normal request's latency under large bodies, and what ambiguous framing gets (issue 26).

    python -m serving.bench.hostile [--target MODEL] [--per-phase 4] [--rounds 10] [--large 8]
                                    [--large-bytes 1000000] [--large-nice 0] [--threads 1]
                                    [--stall-s 30] [--keep-log FILE] [--skip-framing]

Starts the bundled runtime on loopback with an API key (default: a tiny random checkpoint),
then times sequential keyed chat requests alone and while `--large` keyed clients send chat
bodies of `--large-bytes` back to back (from a child process, so they never hold the measuring
client's interpreter lock; each loaded phase starts once every client has a body in flight,
each alone phase once none has); the two phases alternate `--rounds` times. Twice: with bodies
of `--large-bytes` (413 from their Content-Length when past the runtime's body bound, else refused
by their length before tokenizing, when far past the context), and
with bodies just under that character bound (refused once a prefix, tokenized in the runtime's
pool, is past the context). Prints p50 and p95 of each phase and the loaded/alone ratio (goal:
<= 1.5) and the runtime's CPU per large body, then sends each request of `ambiguous_requests`
on a fresh connection and counts responses beyond the first (goal: 0). A normal request
unanswered after `--stall-s` makes the runtime dump every thread's stack into its log
(SIGUSR1), which `--keep-log` keeps.
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import os
import re
import shutil
import signal
import socket
import statistics
import threading
import time
from collections import Counter
from pathlib import Path

import httpx

from serving.tools.local_server import LocalServer

KEY = "hostile-key"
CHAT = {"messages": [{"role": "user", "content": "Name three rivers in Europe."}], "max_tokens": 16,
        "temperature": 0, "ignore_eos": True}


def ambiguous_requests(key: str) -> dict[str, tuple[bytes, ...]]:
    """Request bytes two HTTP parsers could read two ways, each followed by a keyed request a
    smuggler would want served; one write per element (the last case's head in many reads)."""
    auth = b"Authorization: Bearer " + key.encode() + b"\r\n"
    body = b'{"prompt": "hi", "max_tokens": 2}'
    smuggled = b"GET /v1/models HTTP/1.1\r\nHost: x\r\n" + auth + b"\r\n"
    post = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n" + auth
    chunked = b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
    big = b"GET /health HTTP/1.1\r\nHost: x\r\n" + b"".join(b"X-H%d: %s\r\n" % (i, b"a" * 30) for i in range(1000))
    n = len(body)
    return {
        "content-length and transfer-encoding": (post + b"Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n"
                                                 + chunked + smuggled,),
        "transfer-encoding then content-length": (post + b"Transfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n"
                                                  + chunked + smuggled,),
        "two equal content-lengths": (post + b"Content-Length: %d\r\nContent-Length: %d\r\n\r\n" % (n, n)
                                      + body + smuggled,),
        "content-length list": (post + b"Content-Length: %d, %d\r\n\r\n" % (n, n) + body + smuggled,),
        "signed content-length": (post + b"Content-Length: +%d\r\n\r\n" % n + body + smuggled,),
        "negative content-length": (post + b"Content-Length: -1\r\n\r\n" + smuggled,),
        "content-length with junk": (post + b"Content-Length: %dx\r\n\r\n" % n + body + smuggled,),
        "folded transfer-encoding": (post + b"Content-Length: %d\r\nX-A: 1\r\n Transfer-Encoding: chunked\r\n\r\n"
                                     % n + body + smuggled,),
        "HTTP/1.9": (b"GET /health HTTP/1.9\r\nHost: x\r\n\r\n" + smuggled,),
        "HTTP/2.0 over HTTP/1": (b"GET /health HTTP/2.0\r\nHost: x\r\n\r\n" + smuggled,),
        "40 KB head in one read": (big + b"\r\n" + smuggled,),
        "40 KB head in many reads": tuple(big[i:i + 400] for i in range(0, len(big), 400)) + (b"\r\n" + smuggled,),
        "broken chunk size": (post + b"Transfer-Encoding: chunked\r\n\r\nzz\r\n" + body + b"\r\n0\r\n\r\n" + smuggled,),
    }


def exchange(port: int, pieces: tuple[bytes, ...], timeout_s: float = 30.0) -> bytes:
    """Send `pieces`, one write each with a short pause between (so the server reads them
    apart); everything the server sends until it closes (or `timeout_s` passes)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as s:
        for i, piece in enumerate(pieces):
            if i:
                time.sleep(0.001)
            try:
                s.sendall(piece)
            except (BrokenPipeError, ConnectionResetError):
                break                          # refused already, closed before we were done
        out = b""
        try:
            while chunk := s.recv(65536):
                out += chunk
        except (TimeoutError, ConnectionResetError):
            out += b"\r\n<still open>"
    return out


def statuses(raw: bytes) -> list[int]:
    """Status codes of every response in `raw`, in order."""
    return [int(code) for code in re.findall(rb"(?:^|\r\n)HTTP/1\.1 (\d{3}) ", raw)]


TIMEOUT_S = 120.0
STALLS: list[str] = []   # what the watchdog saw: one line per normal request past --stall-s


def keyed_latencies(url: str, count: int, pid: int | None = None, stall_s: float = 30.0) -> list[float]:
    """Seconds per normal request; a request past TIMEOUT_S counts as infinite (and is reported).
    A request still unanswered after `stall_s` makes the runtime `pid` dump its threads' stacks
    to its log (SIGUSR1, serving.server.startup), once per request."""
    out = []
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {KEY}"}, timeout=TIMEOUT_S) as client:
        for _ in range(count):
            began = time.perf_counter()
            watchdog = threading.Timer(stall_s, _dump, (pid, stall_s)) if pid else None
            if watchdog:
                watchdog.start()
            try:
                client.post("/v1/chat/completions", json=CHAT).raise_for_status()
            except httpx.TimeoutException:
                out.append(math.inf)
                continue
            finally:
                if watchdog:
                    watchdog.cancel()
            out.append(time.perf_counter() - began)
    return out


def _dump(pid: int, stall_s: float) -> None:
    """SIGUSR1 to the server and to the engine's process, its child: every thread's stack of both
    into the log (multiprocessing's resource tracker, the other child, has no handler for it)."""
    for target in [pid, *_engine_children(pid)]:
        try:
            os.kill(target, signal.SIGUSR1)
        except ProcessLookupError:
            pass
    STALLS.append(f"{time.strftime('%H:%M:%S')}: a normal request unanswered after {stall_s:.0f} s; "
                  f"the runtime's stacks are in its log, load average {os.getloadavg()[0]:.1f}")


def _engine_children(pid: int) -> list[int]:
    """From /proc, not /server_info: during a stall the engine cannot answer a snapshot."""
    try:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        return [int(c) for c in children if b"resource_tracker" not in Path(f"/proc/{c}/cmdline").read_bytes()]
    except OSError:
        return []


def p95(values: list[float]) -> float:
    return statistics.quantiles(values, n=20, method="inclusive")[-1]


class LargeBodies:
    """`clients` keyed chat requests of `chars` characters, back to back while `active` is set,
    from a child process (they stand in for other machines); `seen` counts answers by status."""

    def __init__(self, url: str, clients: int, chars: int, nice: int = 0):
        self.url, self.clients, self.chars, self.nice = url, clients, chars, nice
        self.stop, self.active = multiprocessing.Event(), multiprocessing.Event()
        self.in_flight = multiprocessing.Value("i", 0)
        self.results: multiprocessing.Queue = multiprocessing.Queue()
        self.process = multiprocessing.Process(target=self._child, daemon=True)
        self.seen: Counter = Counter()

    def __enter__(self) -> "LargeBodies":
        self.process.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.active.set()
        self.seen.update(self.results.get(timeout=120))
        self.process.join(timeout=30)

    def start(self) -> None:
        """Until every client has a body in flight."""
        self.active.set()
        while self.in_flight.value < self.clients:
            time.sleep(0.01)

    def pause(self) -> None:
        """Until no large body is in flight."""
        self.active.clear()
        while self.in_flight.value > 0:
            time.sleep(0.01)

    def _child(self) -> None:
        import threading
        os.nice(self.nice)
        seen: Counter = Counter()
        body = json.dumps({"messages": [{"role": "user", "content": "word " * (self.chars // 5)}],
                           "max_tokens": 1}).encode()
        lock = threading.Lock()

        def loop() -> None:
            with httpx.Client(base_url=self.url, timeout=120, headers={
                    "Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}) as client:
                while not self.stop.is_set():
                    self.active.wait()
                    with self.in_flight.get_lock():
                        self.in_flight.value += 1
                    try:
                        status = client.post("/v1/chat/completions", content=body).status_code
                    except httpx.HTTPError as e:
                        status = type(e).__name__
                    with self.in_flight.get_lock():
                        self.in_flight.value -= 1
                    with lock:
                        seen[status] += 1
        threads = [threading.Thread(target=loop, daemon=True) for _ in range(self.clients)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        self.results.put(seen)


def measure(url: str, args, chars: int, pid: int) -> tuple[list[float], list[float], Counter, float]:
    """Alone and loaded phases of `--per-phase` requests, alternating `--rounds` times, so drift
    in the machine's own load hits both alike; and the runtime's CPU seconds per large body
    (its process's user + system time over the loaded phases, normal requests included)."""
    alone, loaded, cpu = [], [], 0.0
    with LargeBodies(url, args.large, chars, args.large_nice) as large:
        for _ in range(args.rounds):
            large.pause()
            alone += keyed_latencies(url, args.per_phase, pid, args.stall_s)
            large.start()
            began = cpu_seconds(pid)
            loaded += keyed_latencies(url, args.per_phase, pid, args.stall_s)
            cpu += cpu_seconds(pid) - began
    return alone, loaded, large.seen, cpu / max(1, sum(large.seen.values()))


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of process `pid` (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def report(label: str, alone: list[float], loaded: list[float], seen: Counter, cpu: float, args) -> None:
    print(f"{label}:")
    late = sum(math.isinf(x) for x in alone + loaded)
    if late:
        print(f"  normal requests past {TIMEOUT_S:.0f} s: {late} (counted as infinite)")
    print(f"  alone:  p50 {statistics.median(alone):.3f} s  p95 {p95(alone):.3f} s")
    print(f"  loaded: p50 {statistics.median(loaded):.3f} s  p95 {p95(loaded):.3f} s  ({args.large} large-body clients)")
    print(f"  ratio loaded/alone: p50 {statistics.median(loaded) / statistics.median(alone):.2f}  "
          f"p95 {p95(loaded) / p95(alone):.2f} (goal <= 1.5)")
    print("  large-body answers: " + ", ".join(f"{status}: {n}" for status, n in sorted(seen.items(), key=str))
          + f"; runtime CPU per large body {cpu * 1000:.1f} ms")
    if seen.get(200):
        print(f"  note: {seen[200]} large bodies fit the context and were served, not refused: this phase "
              "measured a load of valid prompts")


def framing(port: int) -> int:
    extra = 0
    print("ambiguous framing (one connection each):")
    for name, pieces in ambiguous_requests(KEY).items():
        raw = exchange(port, pieces)
        codes = statuses(raw)
        extra += max(0, len(codes) - 1)
        print(f"  {name}: {codes} {'still open' if raw.endswith(b'<still open>') else 'closed'}")
    print(f"  second responses after ambiguous framing: {extra} (goal 0)")
    return extra


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(prog="python -m serving.bench.hostile", description=__doc__.splitlines()[0])
    ap.add_argument("--target", type=Path, help="checkpoint (default: a tiny random one)")
    ap.add_argument("--per-phase", type=int, default=4, help="normal requests per phase")
    ap.add_argument("--rounds", type=int, default=10, help="alone/loaded phases alternate this many times")
    ap.add_argument("--large", type=int, default=8, help="large-body clients in flight")
    ap.add_argument("--large-bytes", type=int, default=1_000_000)
    ap.add_argument("--large-nice", type=int, default=0,
                    help="niceness of the large-body clients' process (on a machine with few cores, "
                         "19 keeps them from taking the runtime's CPU, as clients on other machines would not)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads of the runtime")
    ap.add_argument("--stall-s", type=float, default=30.0,
                    help="a normal request unanswered this long makes the runtime dump its threads' stacks")
    ap.add_argument("--keep-log", type=Path, help="copy the runtime's log (with any stack dumps) here at the end")
    ap.add_argument("--skip-framing", action="store_true", help="measure latencies only")
    args = ap.parse_args(argv)
    with LocalServer(args.target, ["--api-key", KEY], threads=args.threads) as server:
        try:
            probe(server, args)
        finally:
            if args.keep_log:
                shutil.copyfile(server.server.log, args.keep_log)


def probe(server, args) -> None:
    headers = {"Authorization": f"Bearer {KEY}"}
    model = httpx.get(server.url + "/v1/models", headers=headers).json()["data"][0]
    keyed_latencies(server.url, 2)                         # warm-up
    context = model["max_model_len"]
    # just under the length bound: tokenized in the pool, then refused for its token count
    bound = context * _longest_token_chars(model["root"])
    print(f"target {model['root']}, context {context} tokens; normal request: keyed chat, "
          f"{CHAT['max_tokens']} tokens, {args.per_phase} per phase, {args.rounds} rounds of alone then loaded")
    pid = server.server.process.pid
    print(f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at the start")
    report(f"{args.large_bytes}-byte bodies", *measure(server.url, args, args.large_bytes, pid), args)
    # and under the body bound (read, not refused from its Content-Length); the body carries the
    # chat's JSON around the text
    body_bound = httpx.get(server.url + "/server_info", headers=headers).json()["max_request_bytes"]
    under = min(args.large_bytes, int(bound * 0.9), body_bound - 1024)
    report(f"{under}-character bodies (under the character and body bounds: refused from a tokenized prefix)",
           *measure(server.url, args, under, pid), args)
    print(f"load average at the end: {os.getloadavg()[0]:.1f}")
    print("stalls: " + ("; ".join(STALLS) if STALLS else f"none past {args.stall_s:.0f} s"))
    if not args.skip_framing:
        framing(server.port)


def _longest_token_chars(model_dir: str) -> int:
    """The runtime's length bound per token (serving.models.tokenizer.check_length), from the
    checkpoint's own tokenizer. (Read back from a refusal message, it fell back to 1 whenever the
    probe text was refused by its token count instead; for SmolLM2 (81 characters, context 8192)
    the second phase then sent valid 7,372-character prompts, about 1,500 tokens each.)"""
    from serving.models.tokenizer import Tokenizer

    return Tokenizer.from_dir(model_dir).longest_token_chars


if __name__ == "__main__":
    main()
