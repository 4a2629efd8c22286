"""python -m serving.bench.spec_sets --model M --draft D [--sets default,random-words,unseen]
[--methods none,dflash,dflash+adaptive,...] [--max-tokens N] [--limit N] [--repeat N] [--threads N]
[--dtype float32|bfloat16]

Speculation per prompt set, as ratios to plain decoding measured in one run. For each set
every method gets a fresh runner (an adaptive controller starts cold, its warm-up and trials
included in its figure) and the methods run interleaved prompt by prompt, the turn rotating
(serving.bench.spec.run_methods). Prints, per method, tokens/s over the same set's `none` (the
mean of its `none` runs when given twice, first and last: their spread is the run's noise),
tau, and the setting an adaptive run ended on; then whether every output equals `none`'s.
The `unseen` set is unlike every training prompt of the drafter (serving.tools.prompt_sets).
The load average of the machine is printed before and after: on a shared machine quote it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

METHODS = ("none,dflash,dflash+adaptive,ddtree:8,ddtree:8+adaptive,ddtree:16,ddtree:16+adaptive,"
           "ddtree:32,ddtree:32+adaptive,none")


def parse(argv):
    ap = argparse.ArgumentParser(prog="python -m serving.bench.spec_sets", description=__doc__.splitlines()[2])
    ap.add_argument("--model", required=True, type=Path)
    ap.add_argument("--draft", required=True, type=Path, help="DFlash draft checkpoint")
    ap.add_argument("--sets", default="default,random-words,unseen", help="built-in prompt sets or files")
    ap.add_argument("--methods", default=METHODS, help="as serving.bench; the first must be none")
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--limit", type=int, default=4, help="the first N prompts of each set (0: all)")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--threads", type=int, default=1, help="torch threads (0: torch default)")
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32",
                    help="the target's weights (bfloat16 on CPU: bf16 products and K/V rows, fp32 between them)")
    ap.add_argument("--json", type=Path, help="write the figures here")
    return ap.parse_args(argv)


def load() -> str:
    return "load average " + ", ".join(f"{x:.2f}" for x in os.getloadavg())


def rows(set_name: str, results) -> list[dict]:
    """One row per method: the set, ratio to the set's plain decoding (the mean of its `none`
    runs: give `none` twice, first and last, and their spread is the run's noise), tau, adaptive
    choice, equality."""
    plain = [r.tokens_per_s for r in results if not r.speculative]
    base = sum(plain) / len(plain)
    return [{"set": set_name, "method": r.label, "speculative": r.speculative, "tokens_per_s": round(r.tokens_per_s, 2),
             "ratio": round(r.tokens_per_s / base, 3) if base else 0.0, "tau": round(r.tau, 3),
             "choice": r.choice, "equal_to_none": r.equal_to_none, "settings": r.settings} for r in results]


def table(results: list[dict], sets: list[str]):
    from rich.table import Table

    t = Table(title="ratio to plain (mean of the none runs), tau in brackets, per prompt set, one run")
    t.add_column("method")
    for name in sets:
        t.add_column(name, justify="right")
    per_set = {name: [r for r in results if r["set"] == name] for name in sets}
    for i, method in enumerate(r["method"] for r in per_set[sets[0]]):
        cells = []
        for name in sets:
            r = per_set[name][i]
            mark = "" if r["equal_to_none"] else " NOT EQUAL"
            if not r["speculative"]:
                cells.append(f"{r['tokens_per_s']:.1f} tok/s = {r['ratio']:.2f}x")
            else:
                cells.append(f"{r['ratio']:.2f}x ({r['tau']:.2f}){' ' + r['choice'] if r['choice'] and '+adaptive' in method else ''}{mark}")
        t.add_row(method, *cells)
    return t


def main(argv=None) -> int:
    args = parse(argv)
    import torch
    from rich.console import Console

    from serving.bench.__main__ import load_prompts
    from serving.bench.spec import compare, parse_methods, run_methods
    from serving.models import inspect_checkpoint, load_model
    from serving.models.tokenizer import Tokenizer

    console = Console(width=None if sys.stdout.isatty() else 200)
    if args.threads:
        torch.set_num_threads(args.threads)
    sets = [s.strip() for s in args.sets.split(",") if s.strip()]
    try:
        methods = parse_methods(args.methods)
        if methods[0].spec.speculative:
            raise ValueError("--methods: the first method must be plain decoding, none (the ratios' base)")
        checkpoint = inspect_checkpoint(args.model)
        tokenizer = Tokenizer.from_dir(args.model)
        texts = {name: load_prompts(name, args.limit) for name in sets}
    except (ValueError, OSError) as err:
        console.print(f"[red]error:[/red] {err}")
        return 2
    prompts = {name: [tokenizer.encode_chat([{"role": "user", "content": t}]) for t in ts]
               for name, ts in texts.items()}
    capacity = max(len(p) for ps in prompts.values() for p in ps) + args.max_tokens + 8
    target = load_model(checkpoint, getattr(torch, args.dtype), "cpu", capacity + 128)
    stop_ids = frozenset(checkpoint.config.eos_token_ids) | frozenset(tokenizer.eos_ids)
    before = load()
    console.print(f"{args.model.name} + {args.draft.name}: {', '.join(f'{n} ({len(p)})' for n, p in prompts.items())}"
                  f" prompts, max {args.max_tokens} tokens, {args.dtype}, {torch.get_num_threads()} threads; {before}")
    results = []
    for name in sets:
        console.print(f"set {name}: {', '.join(m.label for m in methods)}, interleaved ...")
        done = run_methods(methods, target, str(args.draft), prompts[name], args.max_tokens, stop_ids,
                           capacity, args.repeat)
        compare(done)
        results += rows(name, done)
    after = load()
    console.print(table(results, sets))
    console.print(f"{before} before, {after} after")
    if args.json:
        report = {"model": str(args.model), "draft": str(args.draft), "dtype": args.dtype,
                  "max_tokens": args.max_tokens,
                  "limit": args.limit, "repeat": args.repeat, "threads": torch.get_num_threads(),
                  "load_before": before, "load_after": after, "results": results}
        args.json.write_text(json.dumps(report, indent=2))
        console.print(f"wrote {args.json}")
    return 0 if all(r["equal_to_none"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
