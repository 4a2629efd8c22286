"""A model's layer products alone, per way to run them: fp32 oneDNN, bf16 oneDNN, bf16 blocked.

    python -m serving.bench.products --model $DDOPS_CACHE/models/smollm2-135m-instruct \\
        [--rows 1,2,4,8,16] [--repeats 7] [--threads 1]

Random weights of the model's layer shapes (fused q/k/v and gate/up, o and down, every layer;
the head left out), each packed as serving.models.cpu_gemm packs it. For each row count, one
pass over all of them per way, the ways interleaved, `--repeats` times; prints the median
milliseconds, the GB/s of weights streamed, and the ratio of each bf16 way against bf16 oneDNN
(vLLM's CPU backend runs its linear layers on oneDNN). The first pass of each primes it.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch

from serving.kernels import linear_bf16
from serving.models.config import read_model_config
from serving.models.cpu_gemm import PACK_ROWS, product


def layer_shapes(model: Path) -> list[tuple[int, int]]:
    c = read_model_config(model)
    q, kv = c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim
    layer = [(q + 2 * kv, c.hidden_size), (c.hidden_size, q), (2 * c.intermediate_size, c.hidden_size),
             (c.hidden_size, c.intermediate_size)]
    return layer * c.num_hidden_layers


def ways(shapes: list[tuple[int, int]]) -> dict[str, tuple[list, torch.dtype]]:
    """name -> (packed weights, the rows' dtype)."""
    gen = torch.Generator().manual_seed(0)
    dense = [torch.randn(n, k, generator=gen) for n, k in shapes]
    onednn = lambda w: torch.ops.mkldnn._reorder_linear_weight(w, PACK_ROWS)  # noqa: E731
    out = {"fp32 oneDNN": ([onednn(w) for w in dense], torch.float32),
           "bf16 oneDNN": ([onednn(w.bfloat16()) for w in dense], torch.bfloat16)}
    if linear_bf16.available("cpu")[0]:
        out["bf16 blocked"] = ([linear_bf16.pack(w.bfloat16()) for w in dense], torch.float32)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m serving.bench.products", description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--rows", default="1,2,4,8,16")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    shapes = layer_shapes(args.model)
    packed = ways(shapes)
    params = sum(n * k for n, k in shapes)
    print(f"{len(shapes)} products, {params / 1e6:.1f} M weights; ours = bf16 blocked, vs = bf16 oneDNN")
    print(f"{'rows':>4} " + " ".join(f"{name + ' ms':>15} {'GB/s':>5}" for name in packed) + f" {'ours/vs':>8}")
    for m in [int(r) for r in args.rows.split(",")]:
        inputs = {k: torch.randn(m, k) for k in {k for _, k in shapes}}
        seconds: dict[str, list[float]] = {name: [] for name in packed}
        with torch.inference_mode():
            for _ in range(args.repeats + 1):
                for name, (weights, dtype) in packed.items():
                    rows = {k: x.to(dtype) for k, x in inputs.items()}
                    began = time.perf_counter()
                    for (n, k), w in zip(shapes, weights):
                        product(rows[k], w, None, 1, n)
                    seconds[name].append(time.perf_counter() - began)
        ms = {name: statistics.median(t[1:]) * 1000 for name, t in seconds.items()}
        cells = []
        for name, t in ms.items():
            width = 4 if name.startswith("fp32") else 2
            cells.append(f"{t:>15.2f} {params * width / t / 1e6:>5.1f}")
        ratio = ms["bf16 oneDNN"] / ms["bf16 blocked"] if "bf16 blocked" in ms else float("nan")
        print(f"{m:>4} " + " ".join(cells) + f" {ratio:>8.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
