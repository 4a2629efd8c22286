"""Held-out tau vs training minutes, from training logs, as a PNG.

    python -m serving.tools.drafter.plot LOG.jsonl[=LABEL] ... --out docs/drafter-tau.png

LOG: a run's OUT.train/log.jsonl. Several logs draw several lines (e.g. recipes compared);
--baseline TAU draws a dashed line for a reference (e.g. the previous drafter's).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .progress import read_log


def draw(runs: list[tuple[str, list[dict]]], out: Path, baseline: tuple[str, float] | None = None,
         title: str = "DFlash drafter: held-out tau vs training time") -> Path:
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2), dpi=120)
    for label, entries in runs:
        ax.plot([e["minutes"] for e in entries], [e["tau"] for e in entries], marker="o", markersize=3, label=label)
    if baseline:
        ax.axhline(baseline[1], linestyle="--", color="grey", label=baseline[0])
    ax.set_xlabel("training minutes (CPU time of training steps, one thread)")
    ax.set_ylabel("held-out tau (tokens per DFlash round)")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    plt.close(fig)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m serving.tools.drafter.plot", description=__doc__.splitlines()[0])
    ap.add_argument("logs", nargs="+", help="LOG.jsonl or LOG.jsonl=LABEL")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--baseline", type=float, help="a reference tau to draw dashed")
    ap.add_argument("--baseline-label", default="previous drafter")
    args = ap.parse_args(argv)
    runs = []
    for item in args.logs:
        path, _, label = item.partition("=")
        runs.append((label or Path(path).parent.name, read_log(Path(path))))
    baseline = (args.baseline_label, args.baseline) if args.baseline is not None else None
    print(f"wrote {draw(runs, args.out, baseline)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
