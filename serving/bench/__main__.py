"""python -m serving.bench --model M --draft D [--methods none,dflash,ddtree:16,ddtree:64]
[--prompts SET|FILE] [--max-tokens N] [--repeat N] [--dtype float32|bfloat16] [--json OUT] [--peer]

Runs every method on the same prompts in one process, interleaved prompt by prompt (so load
on a shared machine falls on every method alike), and prints a Rich table; --json writes
the figures. --prompts: `default` (code and prose), `random-words` (unpredictable
continuations) or a text file, one user prompt per line. Prompts go through the model's chat template. A method may carry
`+adaptive` (the runtime's adaptive controller, e.g. ddtree:64+adaptive). --peer adds z-lab's
dflash package's own loop on the same pair (speedup and "= none" compare it like a method).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def parse(argv):
    ap = argparse.ArgumentParser(prog="python -m serving.bench", description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, type=Path)
    ap.add_argument("--draft", type=Path, help="DFlash draft checkpoint (needed by speculative methods)")
    ap.add_argument("--methods", default="none,dflash,ddtree:16,ddtree:64")
    ap.add_argument("--prompts", help="a built-in set (default, random-words) or a file, one prompt per line")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--limit", type=int, default=0, help="use only the first N prompts")
    ap.add_argument("--repeat", type=int, default=1, help="run the prompt set this many times")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch default)")
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32",
                    help="the target's weights (bfloat16 on CPU: bf16 products, fp32 between them)")
    ap.add_argument("--json", type=Path, help="write the figures here")
    ap.add_argument("--peer", action="store_true",
                    help="also run z-lab's dflash package's own generation loop on the same target and draft")
    return ap.parse_args(argv)


def load_prompts(name: str | None, limit: int) -> list[str]:
    from serving.tools.prompt_sets import PROMPT_SETS

    if name is None or name in PROMPT_SETS:
        prompts = PROMPT_SETS[name or "default"]()
    else:
        prompts = [line for line in Path(name).read_text().splitlines() if line.strip()]
    return prompts[:limit] if limit else prompts


def table(results, header: str):
    from rich.table import Table

    t = Table(title=header)
    hybrid = any(r.state_share is not None for r in results)   # state column only for hybrid targets
    for col in ("method", "tok/s", "speedup", "tau", "draft ms", "tree ms", "verify ms", "accept ms",
                "tree+accept", *(("state",) if hybrid else ()), "= none", "choice"):
        t.add_column(col, justify="right")
    for r in results:
        ms = r.per_round_ms()
        state = (f"{100 * r.state_share:.1f}%",) if hybrid else ()
        t.add_row(r.label, f"{r.tokens_per_s:.1f}", f"{r.speedup:.2f}x", f"{r.tau:.2f}",
                  *(f"{ms[p]:.1f}" for p in ("draft", "tree", "verify", "accept")),
                  f"{100 * r.overhead_share:.1f}%", *state, "yes" if r.equal_to_none else "NO", r.choice)
    return t


def main(argv=None) -> int:
    args = parse(argv)
    import torch
    from rich.console import Console

    from serving.bench.spec import compare, parse_methods, run_methods
    from serving.kernel_report import target_kernels
    from serving.models import inspect_checkpoint, load_model
    from serving.models.tokenizer import Tokenizer

    console = Console(width=None if sys.stdout.isatty() else 160)  # full labels when piped
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        methods = parse_methods(args.methods)
        if any(m.spec.speculative for m in methods) and args.draft is None:
            raise ValueError("--draft is required by the speculative methods")
        checkpoint = inspect_checkpoint(args.model)
        tokenizer = Tokenizer.from_dir(args.model)
        texts = load_prompts(args.prompts, args.limit)
    except (ValueError, OSError) as err:
        console.print(f"[red]error:[/red] {err}")
        return 2
    prompts = [tokenizer.encode_chat([{"role": "user", "content": t}]) for t in texts]
    capacity = max(map(len, prompts)) + args.max_tokens + 8
    target = load_model(checkpoint, getattr(torch, args.dtype), "cpu", capacity + 128)
    stop_ids = frozenset(checkpoint.config.eos_token_ids) | frozenset(tokenizer.eos_ids)
    kernels = target_kernels(target)   # as /server_info reports them
    console.print(f"loaded {args.model} ({len(prompts)} prompts, max {args.max_tokens} tokens, "
                  f"{torch.get_num_threads()} threads); kernels {json.dumps(kernels)}")
    console.print(f"running {', '.join(m.label for m in methods)}, interleaved prompt by prompt ...")
    results = run_methods(methods, target, str(args.draft) if args.draft else None, prompts,
                          args.max_tokens, stop_ids, capacity, args.repeat)
    if args.peer:
        from serving.bench.peer import run_peer

        console.print("running the dflash package's own loop ...")
        results.append(run_peer(args.model, args.draft, prompts * args.repeat, args.max_tokens, stop_ids))
    compare(results)
    console.print(table(results, f"{args.model.name} + {args.draft.name if args.draft else '-'}"))
    if args.json:
        report = {"model": str(args.model), "draft": str(args.draft) if args.draft else None, "dtype": args.dtype,
                  "max_tokens": args.max_tokens, "prompts": len(prompts), "repeat": args.repeat,
                  "threads": torch.get_num_threads(), "kernels": kernels,
                  "methods": [r.summary() for r in results]}
        args.json.write_text(json.dumps(report, indent=2))
        console.print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
