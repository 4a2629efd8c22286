"""torch.compile (inductor, CPU) against the runtime's eager oneDNN path, on the dense part of a
decode step: every layer's post-attention norm, MLP and residual (issue 22's compile lever).

    taskset -c 1 python -m serving.bench.compile_mlp --model $DDOPS_CACHE/models/smollm2-135m-instruct \\
        [--batch 1,8,16] [--calls 20]

Loads the checkpoint twice: as the runtime serves it (projections packed once into oneDNN's
layout, serving.models.cpu_gemm) and with dense weights, which inductor needs: it cannot lower
the packed weights (LoweringException). Compiles the dense blocks for each batch size (one shape
bucket each, `dynamic=False`, `freezing` on) and prints the compile seconds and the CPU
milliseconds per call of compiled, eager packed and eager dense, and the largest difference
between compiled and eager dense outputs.
"""

from __future__ import annotations

import argparse
import time

import torch
import torch._inductor.config as inductor_config

from serving.models import inspect_checkpoint, load_model
from serving.models.llama import CausalLM


def blocks_of(model):
    def blocks(x):                                   # x [B, hidden]
        for layer in model.layers:
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        return x
    return blocks


def cpu_ms(fn, x, calls: int) -> float:
    with torch.inference_mode():
        fn(x)
        began = time.process_time()
        for _ in range(calls):
            fn(x)
        return (time.process_time() - began) / calls * 1000


def dense_model(path: str):
    packing, CausalLM.pack_weights = CausalLM.pack_weights, lambda self: 0
    try:
        return load_model(inspect_checkpoint(path), torch.float32, "cpu", 256)
    finally:
        CausalLM.pack_weights = packing


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m serving.bench.compile_mlp", description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--batch", default="1,8,16")
    ap.add_argument("--calls", type=int, default=20)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    inductor_config.freezing = True
    packed = load_model(inspect_checkpoint(args.model), torch.float32, "cpu", 256)
    dense = dense_model(args.model)
    compiled = torch.compile(blocks_of(dense), dynamic=False)
    for batch in (int(b) for b in args.batch.split(",")):
        x = torch.randn(batch, dense.config.hidden_size)
        began = time.time()
        with torch.inference_mode():
            diff = (compiled(x) - blocks_of(dense)(x)).abs().max().item()
        seconds = time.time() - began
        print(f"batch {batch}: compile {seconds:.1f} s; CPU ms per call: compiled {cpu_ms(compiled, x, args.calls):.2f}, "
              f"eager packed {cpu_ms(blocks_of(packed), x, args.calls):.2f}, "
              f"eager dense {cpu_ms(blocks_of(dense), x, args.calls):.2f}; max |compiled - eager dense| {diff:.1e}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
