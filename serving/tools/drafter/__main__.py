"""Train a DFlash drafter on its target's own chat answers.

    python -m serving.tools.drafter [--arch dflash|dflash2] [--target DIR] [--out DIR] [--minutes 12] [--fresh]

Default target: $DDOPS_CACHE/models/smollm2-135m-instruct; default output:
$DDOPS_CACHE/models/smollm2-135m-instruct-<arch> (config.json, model.safetensors,
draft_vocab.json). --arch dflash2 trains a DFlash2DraftModel: the same layers with grouped
dynamic causal convs and a candidate selector (serving.tools.draft_files.DFLASH2). The target's answers are cached in shards named by digest under
$DDOPS_CACHE/drafter-answers (--answers), shared by every run. Training state lives beside
the output in OUT.train/: checkpoint.pt (resumed by the next run; --fresh starts over) and
log.jsonl (held-out tau vs training minutes; `python -m serving.tools.drafter.plot` draws it).
--minutes counts training time over all resumes, so a longer budget continues a finished run.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch

CACHE = Path(os.environ.get("DDOPS_CACHE", "/var/cache/ddops"))


def parse(argv):
    ap = argparse.ArgumentParser(prog="python -m serving.tools.drafter", description=__doc__.splitlines()[0])
    ap.add_argument("--target", type=Path, default=CACHE / "models/smollm2-135m-instruct")
    ap.add_argument("--arch", choices=sorted(ARCHES), default="dflash", help="draft architecture to train")
    ap.add_argument("--out", type=Path, help="default: $DDOPS_CACHE/models/smollm2-135m-instruct-<arch>")
    ap.add_argument("--answers", type=Path, default=CACHE / "drafter-answers", help="answer shard cache")
    ap.add_argument("--minutes", type=float, default=12.0, help="training-time budget, cumulative over resumes")
    ap.add_argument("--steps", type=int, help="fix the schedule to this many steps (deterministic runs)")
    ap.add_argument("--prompts", type=int, default=320, help="training prompts, each answered greedily")
    ap.add_argument("--sample-every", type=int, default=4, help="every N-th prompt also answered sampled (0: none)")
    ap.add_argument("--max-new", type=int, default=64, help="tokens per answer at most")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--block", type=int, default=8, help="draft block: the bonus plus block-1 proposals")
    ap.add_argument("--taps", type=str, help="target layers the draft reads, e.g. 1,15,27")
    ap.add_argument("--vocab-size", type=int, default=4096, help="draft vocabulary (FR-Spec) size")
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--answers-per-step", type=int, default=4)
    ap.add_argument("--anchors", type=int, default=8, help="blocks per answer per step")
    ap.add_argument("--eval-every", type=int, default=200)
    ap.add_argument("--checkpoint-every", type=int, default=100)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--fresh", action="store_true", help="discard the checkpoint (cached answers are kept)")
    args = ap.parse_args(argv)
    args.out = args.out or CACHE / f"models/smollm2-135m-instruct-{args.arch}"
    return args


def draft_config_for(args, target_raw: dict) -> dict:
    from serving.tools.draft_files import draft_config

    n = target_raw["num_hidden_layers"]
    taps = [int(t) for t in args.taps.split(",")] if args.taps else ([1, n // 2, n - 3] if n >= 8 else None)
    # mask id 0 is <|endoftext|> in SmolLM2: never inside a chat turn
    config = draft_config(target_raw, layers=args.layers, block_size=args.block, taps=taps, mask_token_id=0)
    return ARCHES[args.arch](config)


def _dflash2(config: dict) -> dict:
    from serving.tools.draft_files import dflash2_config

    return dflash2_config(config)


# --arch: the config each trainable architecture starts from (its table row in serving/contract/drafts.py)
ARCHES = {"dflash": lambda config: config, "dflash2": _dflash2}


def main(argv=None) -> int:
    from rich.console import Console

    args = parse(argv)
    torch.set_num_threads(args.threads)
    console = Console()
    folder = args.out.with_name(args.out.name + ".train")
    folder.mkdir(parents=True, exist_ok=True)
    if args.fresh:
        for name in ("checkpoint.pt", "config.json", "vocab.json"):
            (folder / name).unlink(missing_ok=True)
    config = draft_config_for(args, json.loads((args.target / "config.json").read_text()))
    from .run import saved_or_new, train_and_save

    kept = saved_or_new(folder, "config.json", lambda: config)
    if kept != config:
        console.print(f"[red]error:[/red] {folder / 'checkpoint.pt'} trains a different draft shape "
                      f"than these flags ask for; rerun with --fresh to start over")
        return 2
    train_and_save(args, config, folder, console)
    return 0


if __name__ == "__main__":
    sys.exit(main())
