"""Time to first token of a burst: N chat requests arriving at once vs each alone, in the engine.

    python -m serving.bench.burst --model $DDOPS_CACHE/models/smollm2-135m-instruct [--burst 8] [--repeat 2]

No HTTP and no client: requests go straight into the engine (serving.engine.Engine with the
batch runner), so the figures are the scheduler's and the model's own. Each prompt is first
answered alone (its TTFT; their sum is what the burst costs one prompt at a time), then all N
are submitted at once (every request numbered, so the prefix cache can only reuse the chat
template's shared system prompt) (their prompts are prefilled in one packed forward) and every request's
TTFT is taken. Wall-clock and CPU milliseconds of this process: on a shared machine the CPU
figures are the steadier ones. Prints p50/p99 of the burst over the mean alone, the ratio the
load benchmark's TTFT goal is about.
"""

from __future__ import annotations

import argparse
import queue
import statistics
import time
from pathlib import Path

import torch

from serving.tools.prompt_sets import numbered


def parse(argv=None):
    ap = argparse.ArgumentParser(prog="python -m serving.bench.burst", description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, type=Path)
    ap.add_argument("--burst", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    return ap.parse_args(argv)


def first_tokens(engine, prompts: list[list[int]]) -> list[tuple[float, float]]:
    """Submit every prompt at once; (wall s, CPU s) from submission to each first token."""
    from serving.engine import Delta, GenerationRequest, StopRule
    from serving.sampling import SamplingParams

    firsts: list = [None] * len(prompts)
    done: queue.Queue = queue.Queue()
    wall, cpu = time.perf_counter(), time.process_time()

    def emit(event, i):
        if not isinstance(event, Delta):
            done.put(event)
        elif firsts[i] is None:
            firsts[i] = (time.perf_counter() - wall, time.process_time() - cpu)

    for i, prompt in enumerate(prompts):
        engine.submit(GenerationRequest(prompt, SamplingParams(temperature=0), StopRule(2),
                                        lambda e, i=i: emit(e, i)))
    for _ in prompts:
        done.get(timeout=600)
    return firsts


def main(argv=None) -> int:
    from serving.engine import Engine
    from serving.engine.batch import BatchRunner
    from serving.models import inspect_checkpoint, load_model
    from serving.models.tokenizer import Tokenizer

    args = parse(argv)
    torch.set_num_threads(args.threads)
    model = load_model(inspect_checkpoint(args.model), torch.float32, "cpu", 2048)
    tokenizer = Tokenizer.from_dir(args.model)

    def prompts(serial: int) -> list[list[int]]:   # numbered: only the shared system prompt is ever cached
        return [tokenizer.encode_chat([{"role": "user", "content": numbered(serial + i, i)}]) for i in range(args.burst)]

    engine = Engine(lambda: BatchRunner(model, None, capacity=2048), tokenizer).start()
    try:
        first_tokens(engine, prompts(0)[:1])                       # warm-up
        for r in range(args.repeat):
            alone = [first_tokens(engine, [p])[0] for p in prompts(1000 * r + 100)]
            burst = sorted(first_tokens(engine, prompts(1000 * r + 200)), key=lambda t: t[1])
            for kind, k in (("wall", 0), ("CPU", 1)):
                one = statistics.mean(t[k] for t in alone)
                p50, p99 = burst[len(burst) // 2][k], burst[-1][k]
                print(f"repeat {r + 1} {kind}: alone mean {1000 * one:.0f} ms (sum {1000 * sum(t[k] for t in alone):.0f}),"
                      f" burst of {args.burst} p50 {1000 * p50:.0f} ms p99 {1000 * p99:.0f} ms,"
                      f" p99 / alone {p99 / one:.2f}x", flush=True)
    finally:
        engine.stop()
    print(f"prompt tokens: {[len(p) for p in prompts(200)]}, prefix cache hit rate "
          f"{engine.runner.prefix.hit_rate:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
