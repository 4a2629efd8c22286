"""Plain autoregressive decoding: our runtime vs transformers `generate`, same prompts, same run.

    python -m serving.bench.ar --model $DDOPS_CACHE/models/smollm2-135m-instruct [--new-tokens 64]

Prints per-prompt time-to-first-token and decode tokens/s for both, whether the greedy tokens
agree, and the ratios (ours / transformers for tokens/s; transformers / ours for TTFT, so
above 1 means we are faster on both). Each figure is given by wall clock and by this
process's CPU time: on a shared machine the CPU-time figures are the steadier ones.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from serving.engine import Delta, GenerationRequest, StopRule
from serving.engine.batch import BatchRunner
from serving.engine.scheduler import Scheduler
from serving.models import inspect_checkpoint, load_model
from serving.models.tokenizer import Tokenizer
from serving.sampling import SamplingParams

PROMPTS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "user", "content": "Write a Python function that returns the n-th Fibonacci number."}],
    [{"role": "user", "content": "Explain in two sentences why the sky is blue."}],
]
GREEDY = SamplingParams(temperature=0)


@dataclass(frozen=True)
class Clock:
    wall: float
    cpu: float

    @classmethod
    def now(cls) -> "Clock":
        return cls(time.perf_counter(), time.process_time())

    def since(self, start: "Clock") -> "Clock":
        return Clock(self.wall - start.wall, self.cpu - start.cpu)


@dataclass(frozen=True)
class Run:
    ttft: Clock               # prefill + first token
    decode: Clock             # the remaining n - 1 tokens
    tokens: list[int]

    def tokens_per_s(self, kind: str) -> float:
        return (len(self.tokens) - 1) / max(getattr(self.decode, kind), 1e-9)


class Ids:
    """Ids as text: every step's token is new text, so the first one is delivered at once."""

    @staticmethod
    def decode(ids) -> str:
        return " ".join(map(str, ids))


def run_ours(runner: BatchRunner, ids: list[int], n: int) -> Run:
    """One request through the engine's scheduler and batch runner; the first token's time is
    when the scheduler delivers it."""
    stamps, tokens = [], []

    def emit(event) -> None:
        if isinstance(event, Delta):
            stamps.append(Clock.now())
            tokens.extend(event.token_ids)

    steps = Scheduler(runner, Ids(), lambda request, event: request.emit(event), lambda usage: None)
    start = Clock.now()
    steps.admit(GenerationRequest(ids, GREEDY, StopRule(n), emit), start.wall)
    while steps.running:
        steps.step()
    return Run(stamps[0].since(start), Clock.now().since(stamps[0]), tokens)


def run_transformers(model, ids: list[int], n: int) -> Run:
    prompt = torch.tensor([ids])
    # no EOS: both sides decode exactly n tokens (our decoder never stops by itself)
    kwargs = dict(do_sample=False, eos_token_id=None, pad_token_id=0, temperature=None, top_p=None, top_k=None)
    with torch.inference_mode():
        start = Clock.now()
        model.generate(prompt, max_new_tokens=1, **kwargs)
        first = Clock.now()
        out = model.generate(prompt, max_new_tokens=n, **kwargs)
        end = Clock.now()
    ttft = first.since(start)
    total = end.since(first)
    return Run(ttft, Clock(total.wall - ttft.wall, total.cpu - ttft.cpu), out[0, len(ids):].tolist())


def best(runs: list[Run], kind: str) -> tuple[float, float]:
    """Lowest TTFT and highest tokens/s: other load on the machine only ever slows a run."""
    return min(getattr(r.ttft, kind) for r in runs), max(r.tokens_per_s(kind) for r in runs)


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
    decoder = BatchRunner(load_model(inspect_checkpoint(args.model), torch.float32, "cpu", 4096), capacity=4096,
                          prefix_cache=False)
    reference = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32).eval()
    prompts = [tokenizer.encode_chat(p) for p in PROMPTS]
    run_ours(decoder, prompts[0], 8)                     # warm-up both
    run_transformers(reference, prompts[0], 8)
    print(f"model {args.model.name}, fp32 cpu, {args.threads} threads, {args.new_tokens} new tokens per prompt, "
          f"best of {args.repeat} (alternating sides)")
    ratios = {"wall": [], "cpu": []}
    print(f"{'prompt':>6} {'tokens':>6} {'clock':>5} {'ours ttft ms':>12} {'hf ttft ms':>10} "
          f"{'ours tok/s':>10} {'hf tok/s':>8} {'same tokens':>11}")
    for i, ids in enumerate(prompts):
        pairs = [(run_ours(decoder, ids, args.new_tokens), run_transformers(reference, ids, args.new_tokens))
                 for _ in range(args.repeat)]
        ours, theirs = [p[0] for p in pairs], [p[1] for p in pairs]
        same = sum(a == b for a, b in zip(ours[0].tokens, theirs[0].tokens))
        for kind in ("wall", "cpu"):
            (o_ttft, o_tps), (h_ttft, h_tps) = best(ours, kind), best(theirs, kind)
            ratios[kind].append((o_tps / h_tps, h_ttft / o_ttft))
            print(f"{i:>6} {len(ids):>6} {kind:>5} {o_ttft * 1e3:>12.1f} {h_ttft * 1e3:>10.1f} {o_tps:>10.1f} "
                  f"{h_tps:>8.1f} {same:>5}/{len(theirs[0].tokens)}")
    for kind, values in ratios.items():
        print(f"[{kind}] decode tokens/s ratio (ours / transformers): {statistics.mean(v[0] for v in values):.2f}x;"
              f" TTFT ratio (transformers / ours): {statistics.mean(v[1] for v in values):.2f}x")


if __name__ == "__main__":
    main()
