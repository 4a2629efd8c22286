"""One verify forward over a batch of trees of different sizes: ragged vs grouped vs padded.

    python -m serving.bench.mixed_verify --model $DDOPS_CACHE/models/smollm2-135m-instruct \\
        [--rows 9,9,9,9,5,5,1,1] [--context 60] [--steps 5] [--threads 1]

A batch of speculative sequences rarely wants one tree size: one is near its max_tokens and
drafts less, a /health_generate probe drafts a full block, an adaptive round may be plain.
Three ways to verify such a batch with `serving.models.batched.forward`, timed by this
process's CPU time: ragged (what the batch runner does: one forward, each tree only its own
rows), grouped (one forward per tree size), padded (one forward, every tree as wide as the
widest). Trees are DDTree-shaped (serving.speculative.tree.heap_tree) under their ancestor masks.
"""

from __future__ import annotations

import argparse
import time

import torch

from serving.engine.kv_pool import KVPool
from serving.models import batched, inspect_checkpoint, load_model
from serving.speculative.tree import heap_tree, visibility


def tree_of(rows: int):
    """A best-first tree of `rows` rows (root included) over three ranks per depth."""
    depth = max(rows - 1, 1)
    logp = [[-0.1 * d, -1.0 - 0.1 * d, -2.0] for d in range(depth)]
    return heap_tree(7, logp, [[11, 12, 13]] * depth, rows - 1)


def verify_cpu_s(model, caches, sizes: list[int], groups: list[list[int]], steps: int) -> float:
    """CPU seconds per verify of all trees, one batched.forward per group of sequence indices."""
    trees = [tree_of(n) for n in sizes]

    def one_pass(members):
        ts, cs = [trees[i] for i in members], [caches[i] for i in members]
        tokens = torch.tensor([t for tree in ts for t in tree.tokens])
        positions = torch.tensor([c.length + d for tree, c in zip(ts, cs) for d in tree.depths])
        masks = [None if t.is_chain else visibility(t) for t in ts]
        batched.forward(model, tokens, positions, cs, [len(t) for t in ts], masks)

    for members in groups:                  # warm-up; writes are uncommitted, every pass sees the same context
        one_pass(members)
    began = time.process_time()
    for _ in range(steps):
        for members in groups:
            one_pass(members)
    return (time.process_time() - began) / steps


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m serving.bench.mixed_verify", description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--rows", default="9,9,9,9,5,5,1,1", help="verify rows per sequence (tree size incl. root)")
    ap.add_argument("--context", type=int, default=60)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    sizes = [int(r) for r in args.rows.split(",")]
    model = load_model(inspect_checkpoint(args.model), torch.float32, "cpu", args.context + max(sizes) + 8)
    pool = KVPool(model.config, len(sizes) * (args.context + max(sizes) + 2), torch.float32, "cpu")
    caches = [pool.reserve(args.context + max(sizes) + 2) for _ in sizes]
    for cache in caches:
        model.forward(torch.arange(3, 3 + args.context), torch.arange(args.context), cache, last_only=True)
        cache.commit(args.context)
    everyone = list(range(len(sizes)))
    by_size = [[i for i in everyone if sizes[i] == n] for n in sorted(set(sizes))]
    runs = {"ragged": (sizes, [everyone]), "grouped": (sizes, by_size), "padded": ([max(sizes)] * len(sizes), [everyone])}
    print(f"trees of {sizes} rows ({sum(sizes)} rows, {len(sizes) * max(sizes)} padded), context {args.context}")
    base = None
    for name, (shape, groups) in runs.items():
        seconds = verify_cpu_s(model, caches, shape, groups, args.steps)
        base = base or seconds
        print(f"{name:>8}: {1000 * seconds:7.1f} ms CPU per verify, {seconds / base:.2f}x ragged "
              f"({len(groups)} forward{'s' if len(groups) > 1 else ''})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
