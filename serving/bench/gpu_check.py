"""The prepared GPU check (`make gpu-check`): the bundled runtime on CUDA in one short run.

    python -m serving.bench.gpu_check --out gpu-check.json [--device cuda] [--quick]

For a machine lent for minutes, with its own preinstalled torch and no network: nothing is
downloaded. The target is a SmolLM2-135M-shaped checkpoint (576 hidden, 30 layers, 9 heads over
3 KV heads, 49152-token vocabulary, tied head) with seeded random weights in bf16, so every step
costs what SmolLM2's does; the draft is a seeded random DFlash draft for it (block 8, 2 layers).
A random draft is rarely accepted: the DDTree rows measure the tree's verification cost and
check it is lossless on CUDA, not the speed-up a trained drafter gives.

Steps, each recorded in one JSON (the file is rewritten after each step, so a run cut short
keeps what it measured):
1. plain decoding and DDTree (budget 16) at concurrency 1, 8 and 32: output tok/s, TTFT and ITL;
2. lossless on CUDA: T=0 answers of DDTree equal plain's on the same prompts (the same servers);
3. the hybrid kernel parity (`serving.bench.hybrid_cuda`), recorded as skipped with its reason
   when the CUDA kernels it needs are not installed.
--quick shrinks the model and the levels so the command's own plumbing runs on a CPU in seconds
(tests/serving/test_gpu_check.py). Exit 0 when every step that ran passed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from tokenizers import AddedToken

from serving.bench.loadgen import Server, run_level
from serving.bench.serve import summarize
from serving.tools.draft_files import draft_config, random_model, save_draft
from serving.tools.tiny import save_weights, train_tokenizer, write_tiny

SMOLLM2_135M = dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                    num_key_value_heads=3, head_dim=64, vocab_size=49152, max_position_embeddings=8192,
                    rope_theta=100000.0, tie_word_embeddings=True)
QUICK = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
             num_key_value_heads=2, head_dim=16, vocab_size=1024, max_position_embeddings=1024,
             rope_theta=10000.0, tie_word_embeddings=True)
METHODS = {"plain": [], "ddtree:16": ["--speculative-algorithm", "DDTREE", "--speculative-ddtree-budget", "16"]}
HYBRID_TIMEOUT_S = 240


def write_target(out: Path, shape: dict, dtype: str) -> Path:
    """A llama checkpoint of `shape` with the tiny tokenizer padded to the shape's vocabulary
    (filler tokens `<fill_N>`), so random ids above the trained BPE's still decode."""
    from serving.tools.tiny import model_config, random_weights

    write_tiny(out, "llama", dtype, layers=2)          # tokenizer files and settings
    tok = train_tokenizer()
    filler = shape["vocab_size"] - tok.get_vocab_size()
    tok.add_tokens([AddedToken(f"<fill_{i}>", normalized=False) for i in range(filler)])
    tok.save(str(out / "tokenizer.json"))
    cfg = {**model_config("llama", tok.get_vocab_size(), dtype, "none", None), **shape}
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    for old in out.glob("model*.safetensors"):
        old.unlink()
    save_weights({n: t.to(getattr(torch, dtype)) for n, t in random_weights(cfg, 0).items()}, out, 1)
    return out


def write_draft(target: Path, out: Path) -> Path:
    config = draft_config(json.loads((target / "config.json").read_text()), layers=2, block_size=8)
    return save_draft(random_model(config, 0), config, out)


def measure(model: Path, extra: list[str], levels: list[int], max_tokens: int, port: int,
            prompts: list[str]) -> dict:
    """One server: the load at each concurrency level, then greedy answers to `prompts` one at a time."""
    import httpx

    rows = []
    with Server(model, port, 1, extra) as server:
        asyncio.run(run_level(server, 1, 1, max_tokens))      # the first request is cold
        for c in levels:
            began, cpu = time.perf_counter(), server.cpu_s()
            shots = asyncio.run(run_level(server, c, 2, max_tokens))
            rows.append(summarize(c, shots, time.perf_counter() - began, server.cpu_s() - cpu))
            print(json.dumps(rows[-1]), flush=True)
        texts = []
        for p in prompts:
            body = {"model": server.name, "prompt": p, "max_tokens": max_tokens, "temperature": 0}
            reply = httpx.post(f"{server.url}/v1/completions", json=body, timeout=300, trust_env=False)
            texts.append(reply.json()["choices"][0]["text"])
    return {"levels": rows, "answers": texts}


def hybrid_parity(device: str) -> dict:
    if device != "cuda":
        return {"status": "skipped", "reason": "no CUDA device"}
    began = time.perf_counter()
    try:
        done = subprocess.run([sys.executable, "-m", "serving.bench.hybrid_cuda"], capture_output=True,
                              text=True, timeout=HYBRID_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return {"status": "failed", "reason": f"timed out after {HYBRID_TIMEOUT_S} s"}
    tail = (done.stdout + done.stderr)[-4000:]
    no_kernels = done.returncode == 1 and "no kernel" in tail.lower()
    return {"status": "skipped" if no_kernels else ("passed" if done.returncode == 0 else "failed"),
            "rc": done.returncode, "seconds": round(time.perf_counter() - began, 1), "output_tail": tail}


def device_facts(device: str) -> dict:
    facts = {"device": device, "torch": torch.__version__}
    if device == "cuda":
        facts.update(name=torch.cuda.get_device_name(0), cuda=torch.version.cuda,
                     memory_gib=round(torch.cuda.get_device_properties(0).total_memory / 2 ** 30, 1))
    return facts


def run(args) -> dict:
    report: dict = {"facts": device_facts(args.device), "steps": {}}

    def record(step: str, value) -> None:
        report["steps"][step] = value
        args.out.write_text(json.dumps(report, indent=2))

    shape, dtype = (QUICK, "float32") if args.quick else (SMOLLM2_135M, "bfloat16")
    levels, max_tokens = ([1, 2], 8) if args.quick else ([1, 8, 32], 64)
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        target = write_target(Path(tmp) / "target", shape, dtype)
        draft = write_draft(target, Path(tmp) / "draft")
        common, prompts = ["--device", args.device, "--dtype", dtype], [f"Count from {i} upwards:" for i in range(4)]
        for method, flags in METHODS.items():
            spec = [*flags, "--speculative-draft-model-path", str(draft)] if flags else []
            record(method, measure(target, [*common, *spec], levels, max_tokens, args.port, prompts))
    plain, tree = report["steps"]["plain"], report["steps"]["ddtree:16"]
    record("lossless", {"prompts": len(plain["answers"]), "equal": plain["answers"] == tree["answers"]})
    record("ratios", {f"ddtree_over_plain_tok_s_at_{p['concurrency']}": d["output_tok_s"] / p["output_tok_s"]
                      for p, d in zip(plain["levels"], tree["levels"])})
    record("hybrid_parity", hybrid_parity(args.device))
    return report


def passed(report: dict) -> bool:
    steps = report["steps"]
    no_errors = all(row["errors"] == 0 for m in METHODS for row in steps[m]["levels"])
    return no_errors and steps["lossless"]["equal"] and steps["hybrid_parity"]["status"] != "failed"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m serving.bench.gpu_check", description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("gpu-check.json"))
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--quick", action="store_true", help="a tiny model and two levels: the plumbing only")
    ap.add_argument("--port", type=int, default=31400)
    args = ap.parse_args(argv)
    report = run(args)
    ok = passed(report)
    print(json.dumps(report["steps"]["ratios"]), f"lossless={report['steps']['lossless']['equal']}",
          f"hybrid={report['steps']['hybrid_parity']['status']}", "ok" if ok else "FAILED", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
