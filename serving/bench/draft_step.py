"""The batched draft pass alone: CPU time per round of `DFlashDrafter.propose` against batch size.

    python -m serving.bench.draft_step --model $DDOPS_CACHE/models/smollm2-135m-instruct \\
        --draft $DDOPS_CACHE/models/smollm2-135m-instruct-dflash [--batch 1,4,16] \\
        [--context 120] [--rounds 20] [--threads 1]

B sequences with contexts of `--context` + 5*i positions (random target features, absorbed
before timing) and ragged depths (full block, half, one, in turn, as a batch near max_tokens
and with probes drafts), timed by this process's CPU time: one batched round for all B
(one `propose` over B contexts), and the same B blocks drafted one after another (B passes of
one context each) as the peer. Block rows are never committed, so every
round sees the same contexts. The last column is serial over batched.
"""

from __future__ import annotations

import argparse
import time

import torch

from serving.models import inspect_checkpoint, load_model
from serving.speculative.dflash import DFlashDrafter, load_vocab
from serving.speculative.dflash import load_model as load_draft


def cpu_ms(fn, rounds: int) -> float:
    fn()                                 # warm-up
    began = time.process_time()
    for _ in range(rounds):
        fn()
    return 1000 * (time.process_time() - began) / rounds


def round_ms(drafter: DFlashDrafter, batch: int, context: int, rounds: int) -> tuple[float, float, int]:
    """(batched ms, serial ms, rows drafted) per round of `batch` sequences."""
    block, gen = drafter.needs.draft_tokens, torch.Generator().manual_seed(0)
    lengths = [context + 5 * i for i in range(batch)]
    depths = [(block - 1, max(1, (block - 1) // 2), 1)[i % 3] for i in range(batch)]
    bonuses = [3 + i for i in range(batch)]
    features = [torch.randn(n, drafter.feature_width, generator=gen) for n in lengths]
    many = drafter
    rows = [n + block for n in lengths]
    pool, starts = many.pool(sum(rows)), [sum(rows[:i]) for i in range(batch)]
    contexts = [many.context(pool, start, n) for start, n in zip(starts, rows)]
    for c, f in zip(contexts, features):
        many.extend(c, f)
    many.absorb(contexts)

    def serial():
        for context, bonus, depth in zip(contexts, bonuses, depths):
            many.propose([context], [bonus], [depth])
    batched_ms = cpu_ms(lambda: many.propose(contexts, bonuses, depths), rounds)
    return batched_ms, cpu_ms(serial, rounds), sum(depths) + batch


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m serving.bench.draft_step", description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--draft", required=True)
    ap.add_argument("--batch", default="1,4,16")
    ap.add_argument("--context", type=int, default=120)
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    sizes = [int(b) for b in args.batch.split(",")]
    target = load_model(inspect_checkpoint(args.model), torch.float32, "cpu", args.context + 5 * max(sizes) + 64)
    draft = load_draft(args.draft, torch.float32, "cpu")
    drafter = DFlashDrafter(draft, target, vocab=load_vocab(args.draft, target.config.vocab_size))
    print(f"{'batch':>5} {'rows':>5} {'batched ms/round':>17} {'serial ms/round':>16} {'x serial':>9}")
    for b in sizes:
        batched_ms, serial_ms, rows = round_ms(drafter, b, args.context, args.rounds)
        print(f"{b:>5} {rows:>5} {batched_ms:>17.2f} {serial_ms:>16.2f} {serial_ms / batched_ms:>9.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
