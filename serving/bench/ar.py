"""Plain autoregressive decoding: our runtime vs transformers `generate`, same prompts, same run.

    python -m serving.bench.ar --model $DDOPS_CACHE/models/smollm2-135m-instruct [--new-tokens 64]

Prints per-prompt time-to-first-token and decode tokens/s for both, whether the greedy tokens
agree, and the ratios (ours / transformers for tokens/s; transformers / ours for TTFT, so
above 1 means we are faster on both).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

import torch

from serving.engine import ARDecoder
from serving.models import inspect_checkpoint, load_model
from serving.models.tokenizer import Tokenizer
from serving.sampling import SamplingParams

PROMPTS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "user", "content": "Write a Python function that returns the n-th Fibonacci number."}],
    [{"role": "user", "content": "Explain in two sentences why the sky is blue."}],
]
GREEDY = SamplingParams(temperature=0)


def run_ours(decoder: ARDecoder, ids: list[int], n: int) -> tuple[float, float, list[int]]:
    began = time.perf_counter()
    tokens = decoder.start(ids, GREEDY, n)
    ttft = time.perf_counter() - began
    began = time.perf_counter()
    for _ in range(n - 1):
        tokens += decoder.step()
    return ttft, (n - 1) / (time.perf_counter() - began), tokens


def run_transformers(model, ids: list[int], n: int) -> tuple[float, float, list[int]]:
    prompt = torch.tensor([ids])
    # no EOS: both sides decode exactly n tokens (our decoder never stops by itself)
    kwargs = dict(do_sample=False, eos_token_id=None, pad_token_id=0, temperature=None, top_p=None, top_k=None)
    with torch.inference_mode():
        began = time.perf_counter()
        model.generate(prompt, max_new_tokens=1, **kwargs)
        ttft = time.perf_counter() - began
        began = time.perf_counter()
        out = model.generate(prompt, max_new_tokens=n, **kwargs)
        total = time.perf_counter() - began
    return ttft, (n - 1) / max(total - ttft, 1e-9), out[0, len(ids):].tolist()


def best_of(repeat: int, runs: list) -> list[tuple[float, float, list[int]]]:
    """Alternate the sides `repeat` times (so both see the same machine load); keep each side's
    lowest TTFT and highest tokens/s, since other load on the machine only ever slows a run."""
    results = [[run() for run in runs] for _ in range(repeat)]
    return [(min(r[i][0] for r in results), max(r[i][1] for r in results), results[0][i][2])
            for i in range(len(runs))]


def main(argv=None) -> None:
    default = Path(os.environ.get("DDOPS_CACHE", "/var/cache/ddops")) / "models" / "smollm2-135m-instruct"
    ap = argparse.ArgumentParser(prog="python -m serving.bench.ar", description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, default=default)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    ap.add_argument("--repeat", type=int, default=3, help="runs per prompt and side, alternating; the best is kept")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    from transformers import AutoModelForCausalLM  # benchmark-only dependency

    tokenizer = Tokenizer.from_dir(args.model)
    ours = load_model(inspect_checkpoint(args.model), torch.float32, "cpu", 4096)
    decoder = ARDecoder(ours, capacity=4096)
    reference = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval()
    prompts = [tokenizer.encode_chat(p) for p in PROMPTS]
    run_ours(decoder, prompts[0], 8)                     # warm-up both
    run_transformers(reference, prompts[0], 8)
    print(f"model {args.model.name}, fp32 cpu, {args.threads} threads, {args.new_tokens} new tokens per prompt, "
          f"best of {args.repeat}")
    print(f"{'prompt':>6} {'tokens':>6} {'ours ttft ms':>12} {'hf ttft ms':>10} {'ours tok/s':>10} "
          f"{'hf tok/s':>8} {'same tokens':>11}")
    rows = []
    for i, ids in enumerate(prompts):
        (o_ttft, o_tps, o_tokens), (h_ttft, h_tps, h_tokens) = best_of(args.repeat, [
            lambda: run_ours(decoder, ids, args.new_tokens),
            lambda: run_transformers(reference, ids, args.new_tokens)])
        same = sum(a == b for a, b in zip(o_tokens, h_tokens))
        rows.append((o_ttft, h_ttft, o_tps, h_tps))
        print(f"{i:>6} {len(ids):>6} {o_ttft * 1e3:>12.1f} {h_ttft * 1e3:>10.1f} {o_tps:>10.1f} {h_tps:>8.1f} "
              f"{same:>5}/{len(h_tokens)}")
    decode_ratio = statistics.mean(r[2] / r[3] for r in rows)
    ttft_ratio = statistics.mean(r[1] / r[0] for r in rows)
    print(f"decode tokens/s ratio (ours / transformers): {decode_ratio:.2f}x")
    print(f"TTFT ratio (transformers / ours): {ttft_ratio:.2f}x")


if __name__ == "__main__":
    main()
