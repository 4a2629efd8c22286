"""What a hybrid forward keeps from the forward to its commit (HybridCache.staged), per Gated
DeltaNet layer and over all of them, at a checkpoint's linear-attention shapes.

    python -m serving.bench.hybrid_staged --model tests/fit/configs/Qwen3.6-27B [--rows 512]
        [--dtype bfloat16]

Reads only config.json. One linear-attention layer (random weights; the hidden size is shrunk
to 64, since it sizes the projections, not what is staged) runs `--rows` new rows from the zero
state twice: as a prefill (`last_only`: its caller commits every row) and as a verify forward
(a shorter prefix may be committed). Printed: the bytes of the distinct storages the cache then
holds for that layer, and that times the config's linear layers, which is how much the
forward's activations outlive it (serving.memory counts none of it: it is transient).
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import torch

from serving.models.config import read_model_config
from serving.models.gated_deltanet import GatedDeltaNet
from serving.models.gdn_kernels import TORCH
from serving.models.hybrid_cache import HybridCache
from serving.models.linear_rows import plan_rows

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def staged_bytes(config, rows: int, dtype: torch.dtype, prefixes: bool) -> int:
    """Bytes one linear layer's forward of `rows` rows leaves staged in its cache."""
    layer = GatedDeltaNet(config, 0, dtype)
    with torch.no_grad():
        for p in layer.parameters():
            p.normal_(0.0, 0.02)
    cache = HybridCache(config, 1, dtype, "cpu")
    plan = plan_rows(rows, None, config.linear.conv_kernel, "cpu")
    cache.begin(plan, prefixes=prefixes)
    with torch.inference_mode():
        layer(torch.randn(rows, config.hidden_size, dtype=dtype), cache, plan, TORCH)
    tensors = [t for entry in cache.staged[:1] for part in entry if part is not None
               for t in (part if isinstance(part, tuple) else (part,))]
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}
    return sum(storages.values())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m serving.bench.hybrid_staged", description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, type=Path, help="a checkpoint directory (config.json is enough)")
    ap.add_argument("--rows", type=int, default=512, help="new rows in the forward (a prefill chunk)")
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="bfloat16")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    config = read_model_config(args.model)
    if not config.hybrid:
        ap.error(f"{args.model}: not a hybrid (no linear-attention layers)")
    config = dataclasses.replace(config, hidden_size=64)
    layers = len(config.linear_layers)
    print(f"{args.rows} rows, {args.dtype}, {layers} linear-attention layers")
    print(f"{'forward':>26} {'MiB per layer':>14} {'MiB in all':>11}")
    for label, prefixes in (("prefill (last_only)", False), ("verify (prefix commit)", True)):
        held = staged_bytes(config, args.rows, DTYPES[args.dtype], prefixes)
        print(f"{label:>26} {held / 2**20:>14.2f} {held * layers / 2**20:>11.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
