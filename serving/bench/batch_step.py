"""The batched decode step alone: CPU time per step and tokens per CPU-second against batch size.

    python -m serving.bench.batch_step --model $DDOPS_CACHE/models/smollm2-135m-instruct \\
        [--batch 1,2,4,8,16] [--context 60] [--steps 5] [--threads 1] [--pad-ab 5]

Fills B pool views with a `--context`-token prompt each, then times `--steps` decode steps
(B = 1: the single-sequence `forward`; B > 1: `serving.models.batched.decode_step`) by this
process's CPU time, which a shared machine disturbs less than the wall clock. The last column
is the throughput ratio against B = 1: what batching buys before any HTTP or scheduling.
With `--pad-ab N`, each batch size is timed N times with products of fewer than 4 rows padded
to 4 and N times unpadded, interleaved (serving.models.cpu_gemm.small_rows), medians printed
with their ratio, beside the choice the model made at load.
"""

from __future__ import annotations

import argparse
import time

import torch

from serving.engine.kv_pool import KVPool
from serving.models import batched, inspect_checkpoint, load_model


def step_cpu_s(model, pool: KVPool, batch: int, context: int, steps: int) -> float:
    caches = [pool.reserve(context + steps + 2) for _ in range(batch)]
    prompt = torch.arange(3, 3 + context)
    for cache in caches:
        model.forward(prompt, torch.arange(context), cache, last_only=True)
        cache.commit(context)
    tokens = torch.full((batch,), 5)

    def step():
        positions = torch.tensor([c.length for c in caches])
        if batch == 1:
            model.forward(tokens, positions, caches[0], last_only=True)
        else:
            batched.decode_step(model, tokens, positions, caches)

    step()                      # warm-up; writes are uncommitted, so every step sees the same context
    began = time.process_time()
    for _ in range(steps):
        step()
    for cache in caches:
        pool.release(cache)
    return (time.process_time() - began) / steps


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m serving.bench.batch_step", description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--batch", default="1,2,4,8,16")
    ap.add_argument("--context", type=int, default=60)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    ap.add_argument("--pad-ab", type=int, default=0, help="time padded against unpadded products N times each")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    model = load_model(inspect_checkpoint(args.model), getattr(torch, args.dtype), "cpu", args.context + args.steps + 8)
    sizes = [int(b) for b in args.batch.split(",")]
    pool = KVPool(model.config, max(sizes) * (args.context + args.steps + 2), model.dtype, "cpu")
    if args.pad_ab:
        return pad_ab(model, pool, sizes, args)
    base = None
    print(f"{'batch':>5} {'ms/step (CPU)':>14} {'tok/CPU-s':>10} {'x vs B=1':>9}")
    for b in sizes:
        seconds = step_cpu_s(model, pool, b, args.context, args.steps)
        rate = b / seconds
        base = base or (rate if b == 1 else None)
        print(f"{b:>5} {seconds * 1000:>14.1f} {rate:>10.1f} {rate / base if base else float('nan'):>9.2f}")
    return 0


def pad_ab(model, pool: KVPool, sizes: list[int], args) -> int:
    """Padded (to 4 rows) against unpadded products, interleaved, per batch size."""
    chosen = model.head_min_rows
    print(f"chosen at load: {model.products}")
    print(f"{'batch':>5} {'unpadded ms':>12} {'padded ms':>10} {'x':>6}")
    for b in sizes:
        times: dict[int, list[float]] = {1: [], 4: []}
        for _ in range(args.pad_ab):
            for rows in (1, 4):
                model.pad_products(rows)
                times[rows].append(step_cpu_s(model, pool, b, args.context, args.steps))
        plain, padded = (sorted(t)[len(t) // 2] * 1000 for t in (times[1], times[4]))
        print(f"{b:>5} {plain:>12.1f} {padded:>10.1f} {plain / padded:>6.2f}")
    model.pad_products(chosen)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
