"""CUDA check of the hybrid kernel path: parity with the PyTorch reference, and timings.

    python -m serving.bench.hybrid_cuda [--model DIR] [--dtype bfloat16] [--prompt 512] [--batch 8]

Needs a CUDA device with fla-core and causal-conv1d installed (`pip install '.[cuda-hybrid]'`).
Per op, at Qwen3.6-27B's Gated DeltaNet shapes (48 value heads over 16 key heads, dk = dv = 128,
conv kernel 4): the chunked chain (prefill of --prompt rows), the one-token recurrent step for
--batch sequences, the conv chain and the conv step, each through serving.models.gdn_ops on the
chosen kernels and on PyTorch, on the start-up probe's inputs (serving.models.gdn_ops.op_cases):
the error relative to the PyTorch output's scale (the probe's measure) and milliseconds of each.
Then a whole model (--model, default the tiny hybrid of `serving.tools.tiny --arch qwen3_5`):
prefill logits and 16 greedy steps on both paths. Exit 1 when no kernel was chosen (printing
why), an op's error exceeds the probe's tolerance or the greedy ids differ; 0 otherwise.
tests/hybrid/test_kernels.py runs the same comparisons on CPU with the PyTorch references in
the kernels' conventions, so this command's own plumbing is tested.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from serving.models import gdn_kernels, gdn_ops, inspect_checkpoint, load_model
from serving.models.config import LinearAttention

TORCH = gdn_kernels.KernelChoice()
HK, HV, DK, DV, KERNEL = 16, 48, 128, 128, 4
SHAPES_27B = LinearAttention(num_key_heads=HK, num_value_heads=HV, key_head_dim=DK, value_head_dim=DV,
                             conv_kernel=KERNEL)
OP_NAMES = {"chunk": "prefill delta rule", "recurrent": "decode delta rule", "conv_chain": "prefill conv",
            "conv_step": "decode conv"}


def sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def timed(fn, device, repeat: int = 5):
    """(result, ms per call) after one warm-up call (Triton compiles on the first)."""
    out = fn()
    sync(device)
    began = time.perf_counter()
    for _ in range(repeat):
        out = fn()
    sync(device)
    return out, 1000 * (time.perf_counter() - began) / repeat


def op_rows(choice, dtype, prompt: int, batch: int, dev: str = "cuda") -> list[tuple]:
    """(op, relative error, kernel ms, torch ms, within the probe's tolerance) per op, on the
    start-up probe's cases (gdn_ops.op_cases) at --prompt rows and --batch sequences."""
    cases = gdn_ops.op_cases(SHAPES_27B, dtype, dev, rows=prompt, batch=batch)
    rows = []
    for field, run in cases.items():
        try:
            got, ms = timed(lambda: run(choice), dev)
            ref, ref_ms = timed(lambda: run(TORCH), dev)
            error = gdn_ops.relative_error(got, ref)
            rows.append((OP_NAMES[field], error, ms, ref_ms, error <= gdn_ops.PROBE_TOLERANCE[dtype]))
        except Exception as e:   # a kernel that cannot take these shapes is a finding, not a crash
            rows.append((f"{OP_NAMES[field]}: {type(e).__name__}: {e}"[:160], float("inf"), 0.0, 0.0, False))
    return rows


def model_rows(model_dir: Path, choice, dtype, dev: str = "cuda") -> list[tuple]:
    """One row: logits of prefill + 16 greedy steps; passes when the greedy ids agree."""
    model = load_model(inspect_checkpoint(model_dir), dtype, dev, 1024)
    prompt = torch.arange(3, 300, device=dev) % model.config.vocab_size
    runs = {}
    for name, ops in (("kernels", choice), ("torch", TORCH)):
        model._ops = ops
        began = time.perf_counter()
        cache = model.new_cache(512)
        logits, _ = model.forward(prompt, torch.arange(prompt.numel(), device=dev), cache, last_only=True)
        cache.commit(prompt.numel())
        steps = [logits.float()]
        for t in range(16):
            token = steps[-1].argmax(-1)
            steps.append(model.forward(token, torch.tensor([prompt.numel() + t], device=dev), cache)[0].float())
            cache.commit(1)
        sync(dev)
        runs[name] = (torch.cat(steps), 1000 * (time.perf_counter() - began))
    same = bool((runs["kernels"][0].argmax(-1) == runs["torch"][0].argmax(-1)).all())
    error = gdn_ops.relative_error((runs["kernels"][0],), (runs["torch"][0],))
    return [(f"model prefill {prompt.numel()} + 16 steps (greedy ids equal: {same})", error,
             runs["kernels"][1], runs["torch"][1], same)]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m serving.bench.hybrid_cuda", description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, help="a hybrid checkpoint (default: a fresh tiny one)")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--batch", type=int, default=8)
    args = ap.parse_args(argv)
    dtype = getattr(torch, args.dtype)
    if not torch.cuda.is_available():
        print("no CUDA device: the kernel path cannot run here")
        return 1
    choice = gdn_kernels.select("cuda", dtype)
    print("kernels:", choice.report())
    if choice.why_torch:
        print("PyTorch runs instead of some kernels:", choice.why_torch)
    probed = gdn_ops.probe(choice, SHAPES_27B, dtype, "cuda")      # what a served 27B would keep
    print("after the start-up probe at the 27B's shapes:", probed.report())
    rows = op_rows(choice, dtype, args.prompt, args.batch)
    with tempfile.TemporaryDirectory() as tmp:
        model = args.model or Path(tmp) / "tiny-qwen3_5"
        if args.model is None:
            subprocess.run([sys.executable, "-m", "serving.tools.tiny", "--arch", "qwen3_5", "--out", str(model)],
                           check=True, capture_output=True)
        rows += model_rows(model, choice, dtype)
    print(f"{'check':<60} {'rel. error':>11} {'kernel ms':>10} {'torch ms':>10}")
    for name, diff, ms, ref_ms, _ in rows:
        print(f"{name:<60} {diff:>11.3g} {ms:>10.3f} {ref_ms:>10.3f}")
    chosen = any(f is not None for f in (choice.chunk, choice.recurrent, choice.conv_chain, choice.conv_step))
    return 0 if chosen and all(row[-1] for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
