"""Load benchmark: streaming chat requests from the official `openai` async client at
concurrency 1, 2, 4, 8, 16 against the runtime, and transformers' continuous batching
(`generate_batch`) on the same prompts at one concurrency, in the same run.

    python -m serving.bench.serve --model $DDOPS_CACHE/models/smollm2-135m-instruct \\
        [--concurrency 1,2,4,8,16] [--requests-per-client 2] [--max-tokens 32] [--peer-at 8] \\
        [--json OUT.json] [--plot OUT.png] [--server-arg=--speculative-algorithm=...] [--serial]
    python -m serving.bench.serve --model M --soak 120 --clients 64      # bounded loopback soak

Starts the runtime as a subprocess on a loopback port (or uses --url). Prints a Rich table of
output tokens/s, requests/s, TTFT and inter-token latency p50/p99 per concurrency; --json and
--plot write the figures and a PNG (throughput and p99 latencies vs concurrency). Every
request ignores EOS so each produces exactly --max-tokens tokens; greedy. Beside wall-clock
figures, tokens per CPU-second of the server process (and of the peer's process): on a shared
machine the CPU share a process gets swings, and CPU time is the steadier comparison. The soak counts
complete answers, 503 server_busy, other errors and truncated streams, and the server's RSS.
--serial runs the same sweep again on a second server with `--max-running-requests 1` (one
sequence at a time, as before batching) and reports batched over serial per concurrency: with a
speculative method's --server-args, batched speculative rounds against serial ones. With a
speculative method, the server's per-batch-size settings (`speculative_settings_by_batch`:
what the adaptive controller measured and chose) are printed after each sweep.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path

from serving.bench.loadgen import Server, Shot, run_level, soak
from serving.tools.prompt_sets import numbered


def parse(argv=None):
    ap = argparse.ArgumentParser(prog="python -m serving.bench.serve", description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, type=Path)
    ap.add_argument("--url", help="an already running server (default: start one)")
    ap.add_argument("--port", type=int, default=31000)
    ap.add_argument("--server-arg", action="append", default=[], help="extra runtime flag, e.g. --server-arg=--dtype=float32")
    ap.add_argument("--concurrency", default="1,2,4,8,16")
    ap.add_argument("--requests-per-client", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--peer-at", type=int, default=8, help="transformers generate_batch at this concurrency (0: skip)")
    ap.add_argument("--threads", type=int, default=2, help="torch threads for the server and the peer")
    ap.add_argument("--soak", type=float, default=0, help="seconds of soak instead of the sweep")
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--serial", action="store_true",
                    help="also sweep a server with --max-running-requests 1 and report batched / serial")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--plot", type=Path)
    return ap.parse_args(argv)


def pct(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def summarize(concurrency: int, shots: list[Shot], wall: float, cpu: float) -> dict:
    ok = [s for s in shots if s.error is None]
    itl = [gap for s in ok for gap in s.gaps]
    tokens = sum(s.tokens for s in ok)
    return {"concurrency": concurrency, "requests": len(shots), "errors": len(shots) - len(ok),
            "output_tokens": tokens, "wall_s": wall, "server_cpu_s": cpu,
            "output_tok_s": tokens / wall, "output_tok_per_cpu_s": tokens / max(cpu, 1e-9), "req_s": len(ok) / wall,
            "ttft_p50_ms": 1000 * pct([s.ttft for s in ok], 50), "ttft_p99_ms": 1000 * pct([s.ttft for s in ok], 99),
            "itl_p50_ms": 1000 * pct(itl, 50), "itl_p99_ms": 1000 * pct(itl, 99)}


def peer(model: Path, concurrency: int, requests: int, max_tokens: int, threads: int) -> dict:
    """transformers continuous batching over the same chat prompts, `concurrency` slots."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, ContinuousBatchingConfig, GenerationConfig

    torch.set_num_threads(threads)
    tok = AutoTokenizer.from_pretrained(model)
    lm = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32, attn_implementation="sdpa")
    inputs = [tok.apply_chat_template([{"role": "user", "content": numbered(1_000_000 + i, i)}],
                                      add_generation_prompt=True) for i in range(requests)]
    inputs = [list(x["input_ids"] if hasattr(x, "keys") else x) for x in inputs]
    config = GenerationConfig(max_new_tokens=max_tokens, do_sample=False, eos_token_id=-1, pad_token_id=0)
    # at most `concurrency` requests per batch, the same prefill chunk as the runtime's default
    cb = ContinuousBatchingConfig(page_size=64, num_blocks=16 * concurrency, max_batch_tokens=512,
                                  max_requests_per_batch=concurrency, use_cuda_graph=False)
    began, cpu = time.perf_counter(), time.process_time()
    out = lm.generate_batch(inputs=inputs, generation_config=config, continuous_batching_config=cb,
                            progress_bar=False, warmup=False)
    wall, cpu = time.perf_counter() - began, time.process_time() - cpu
    tokens = sum(len(o.generated_tokens) for o in out.values())
    return {"concurrency": concurrency, "requests": requests, "output_tokens": tokens, "wall_s": wall,
            "cpu_s": cpu, "output_tok_s": tokens / wall, "output_tok_per_cpu_s": tokens / max(cpu, 1e-9),
            "req_s": requests / wall}


def table(levels: list[dict], peer_row: dict | None, conditions: str) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"serving load benchmark ({conditions})")
    levels = [{**r, "concurrency": f"{r['concurrency']}{r.get('label', '')}"} for r in levels]
    for col in ("concurrency", "requests", "errors", "output tok/s", "tok/CPU-s", "req/s", "TTFT p50 ms",
                "TTFT p99 ms", "ITL p50 ms", "ITL p99 ms"):
        t.add_column(col, justify="right")
    for r in levels:
        t.add_row(str(r["concurrency"]), str(r["requests"]), str(r["errors"]), f"{r['output_tok_s']:.1f}",
                  f"{r['output_tok_per_cpu_s']:.1f}", f"{r['req_s']:.2f}", f"{r['ttft_p50_ms']:.0f}", f"{r['ttft_p99_ms']:.0f}",
                  f"{r['itl_p50_ms']:.0f}", f"{r['itl_p99_ms']:.0f}")
    if peer_row:
        t.add_row(f"transformers @{peer_row['concurrency']}", str(peer_row["requests"]), "-",
                  f"{peer_row['output_tok_s']:.1f}", f"{peer_row['output_tok_per_cpu_s']:.1f}",
                  f"{peer_row['req_s']:.2f}", "-", "-", "-", "-")
    Console(width=160).print(t)


def ratios(levels: list[dict], peer_row: dict | None, at: int) -> dict:
    by = {r["concurrency"]: r for r in levels}
    out = {}
    if 1 in by and at in by:
        out[f"tok_s_{at}_over_1"] = by[at]["output_tok_s"] / by[1]["output_tok_s"]
        out[f"tok_per_cpu_s_{at}_over_1"] = by[at]["output_tok_per_cpu_s"] / by[1]["output_tok_per_cpu_s"]
        out[f"ttft_p99_{at}_over_1"] = by[at]["ttft_p99_ms"] / max(by[1]["ttft_p99_ms"], 1e-9)
    if peer_row and at in by:
        out[f"tok_s_ours_over_transformers_at_{at}"] = by[at]["output_tok_s"] / peer_row["output_tok_s"]
        out[f"tok_per_cpu_s_ours_over_transformers_at_{at}"] = (by[at]["output_tok_per_cpu_s"]
                                                                / peer_row["output_tok_per_cpu_s"])
    return out


def plot(levels: list[dict], peer_row: dict | None, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    c = [r["concurrency"] for r in levels]
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    a.plot(c, [r["output_tok_s"] for r in levels], "o-", label="ours")
    if peer_row:
        a.plot([peer_row["concurrency"]], [peer_row["output_tok_s"]], "s", label="transformers generate_batch")
    a.set(xlabel="concurrency", ylabel="output tokens/s", xscale="log", title="throughput")
    a.legend()
    b.plot(c, [r["ttft_p99_ms"] for r in levels], "o-", label="TTFT p99")
    b.plot(c, [r["itl_p99_ms"] for r in levels], "o-", label="ITL p99")
    b.set(xlabel="concurrency", ylabel="ms", xscale="log", title="p99 latency")
    b.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def sweep(args, extra: list[str]) -> tuple[list[dict], dict, dict]:
    """Every concurrency level against one server started with `extra` flags; its speculative
    settings per batch size afterwards (empty for plain decoding) and the kernels it ran."""
    levels = []
    with Server(args.model, args.port, args.threads, extra, args.url) as server:
        # one unrecorded request first: the server's first is cold (allocator, first kernels) and
        # would otherwise be concurrency 1's p99, flattering every "at 8 / at 1" latency ratio
        asyncio.run(run_level(server, 1, 1, args.max_tokens))
        for c in [int(x) for x in args.concurrency.split(",")]:
            began, cpu = time.perf_counter(), server.cpu_s()
            shots = asyncio.run(run_level(server, c, args.requests_per_client, args.max_tokens))
            levels.append(summarize(c, shots, time.perf_counter() - began, server.cpu_s() - cpu))
            print(json.dumps(levels[-1]), flush=True)
        server_info = server.info()
    info, kernels = server_info.get("speculative_settings_by_batch") or {}, server_info.get("kernels", {})
    print("kernels: " + json.dumps(kernels), flush=True)
    for key, bucket in info.items():
        print(f"batch {key}: current {bucket['current']}; " + ", ".join(
            f"{s['setting']} {s['rounds']} rounds {s['tokens_per_round']} tok/round {s['tokens_per_s']} tok/s"
            for s in bucket["settings"]), flush=True)
    return levels, info, kernels


def serial_ratios(levels: list[dict], serial: list[dict]) -> dict:
    by = {r["concurrency"]: r for r in serial}
    return {f"tok_s_batched_over_serial_at_{r['concurrency']}": r["output_tok_s"] / by[r["concurrency"]]["output_tok_s"]
            for r in levels if r["concurrency"] in by}


def main(argv=None) -> int:
    args = parse(argv)
    if args.soak:
        with Server(args.model, args.port, args.threads, args.server_arg, args.url) as server:
            report = asyncio.run(soak(server, args.clients, args.soak, args.max_tokens))
        print(json.dumps(report, indent=2))
        if args.json:
            args.json.write_text(json.dumps(report, indent=2))
        return 0 if report["other_errors"] == 0 and report["truncated"] == 0 else 1
    levels, settings, kernels = sweep(args, args.server_arg)
    one_at_a_time = ["--max-running-requests=1", "--max-queued-requests=256"]    # the others wait, none refused
    serial, _, _ = sweep(args, [*args.server_arg, *one_at_a_time]) if args.serial else ([], {}, {})
    peer_row = peer(args.model, args.peer_at, args.peer_at * args.requests_per_client, args.max_tokens,
                    args.threads) if args.peer_at else None
    conditions = f"{args.max_tokens} tokens/request, {args.threads} torch threads, greedy, ignore_eos"
    table(levels + [{**r, "label": " serial"} for r in serial], peer_row, conditions)
    report = {"conditions": conditions, "server_args": args.server_arg, "levels": levels, "transformers": peer_row,
              "ratios": {**ratios(levels, peer_row, args.peer_at or 8), **serial_ratios(levels, serial)},
              "serial_levels": serial, "speculative_settings_by_batch": settings, "kernels": kernels}
    print(json.dumps(report["ratios"], indent=2))
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    if args.plot:
        plot(levels, peer_row, args.plot)
    return 0 if all(r["errors"] == 0 for r in levels + serial) else 1


if __name__ == "__main__":
    raise SystemExit(main())
