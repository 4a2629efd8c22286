"""Tiny DFlash drafts for the tiny targets of serving.tools.tiny (tests, lab hosts, demos).

    python -m serving.tools.tiny_draft --target DIR --out DIR [--distill] [--seed N]

Random: a draft in the released layout whose shapes match the target; acceptance is low but
every code path runs. Distilled (--distill): the same draft trained for 1600 steps
on the target's own continuations and chat answers (about a minute on one core), so
a tiny pair has real acceptance (tau > 1) on completion and chat requests alike.
Deterministic: the same flags give the same weights.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from serving.tools.draft_files import TINY_BLOCK, TINY_LAYERS, draft_config, random_model, save_draft

__all__ = ["TINY_BLOCK", "TINY_LAYERS", "draft_config", "random_model", "save_draft", "write_tiny_draft"]


def write_tiny_draft(target_dir: Path, out: Path, seed: int = 0, distill: bool = False,
                     steps: int = 1600, **shape) -> Path:
    target_raw = json.loads((Path(target_dir) / "config.json").read_text())
    config = draft_config(target_raw, wide=distill, **shape)
    model = random_model(config, seed)
    if distill:
        from serving.tools.train_draft import distill_on_own_text

        model = distill_on_own_text(model, Path(target_dir), steps=steps, seed=seed)
    return save_draft(model, config, out)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(prog="python -m serving.tools.tiny_draft", description=__doc__.splitlines()[0])
    ap.add_argument("--target", required=True, type=Path)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--distill", action="store_true")
    ap.add_argument("--steps", type=int, default=1600)
    args = ap.parse_args(argv)
    out = write_tiny_draft(args.target, args.out, args.seed, args.distill, args.steps)
    print(f"wrote {'distilled' if args.distill else 'random'} tiny DFlash draft to {out}")


if __name__ == "__main__":
    main()
