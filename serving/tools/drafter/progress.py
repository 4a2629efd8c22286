"""What a training run shows and keeps: a Rich progress bar (ETA, loss, last held-out tau)
and a JSON-lines log of every held-out measurement, which plot.py draws."""

from __future__ import annotations

import json
import time
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

LOG = "log.jsonl"
UNITS = 1000  # the bar's total: progress fraction in thousandths


def bar(console: Console) -> Progress:
    return Progress(TextColumn("[bold]{task.description}"), BarColumn(), TextColumn("{task.percentage:>5.1f}%"),
                    TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(),
                    TextColumn("{task.fields[status]}"), console=console)


class TrainingReport:
    """Called after every training step: moves the bar; logs and prints each held-out tau."""

    def __init__(self, progress: Progress, folder: Path, fresh: bool):
        self.progress, self.path = progress, folder / LOG
        if fresh:
            self.path.write_text("")
        self.task = progress.add_task("training", total=UNITS, status="")
        self.tau = float("nan")

    def __call__(self, trainer, tau: float | None) -> None:
        if tau is not None:
            self.record(trainer, tau)
        self.progress.update(self.task, completed=int(UNITS * trainer.progress),
                             status=f"step {trainer.step} loss {trainer.loss:.3f} tau {self.tau:.2f}")

    def record(self, trainer, tau: float) -> None:
        self.tau = tau
        entry = {"step": trainer.step, "minutes": round(trainer.seconds / 60, 3), "loss": round(trainer.loss, 4),
                 "tau": round(tau, 4), "lr": trainer.lr(), "at": time.strftime("%Y-%m-%dT%H:%M:%S")}
        with self.path.open("a") as f:
            f.write(json.dumps(entry) + "\n")
        self.progress.console.log(f"step {trainer.step}: {entry['minutes']:.1f} training min, "
                                  f"loss {trainer.loss:.3f}, held-out tau {tau:.3f}")


def read_log(path: Path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
