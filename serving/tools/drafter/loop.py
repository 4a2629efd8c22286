"""The training loop: resumable, measured on held-out answers as it goes.

State that a resume restores exactly: draft weights, AdamW moments, step, training seconds,
and the one torch.Generator every random choice (answer, anchors) is drawn from, which is
also the data cursor. With a fixed --steps schedule and one thread, an interrupted run that
resumes ends bit-identical to an uninterrupted one (tests/speculative/test_drafter.py).

Schedule: linear warm-up, then cosine from the peak to a tenth of it over the run's progress,
progress = the larger of step/steps and training seconds/budget (either may be unset).
Training seconds are the process's CPU time in training steps (all torch threads), so a
budget buys the same work on a busy machine as on an idle one, only later; they exclude
held-out evaluation and checkpoint writes. With --threads 1 they equal wall time when idle.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from .objective import block_loss, held_out_tau, vocab_index

CHECKPOINT = "checkpoint.pt"


@dataclass(frozen=True)
class Settings:
    steps: int | None = None          # fixes the schedule's length in steps
    minutes: float | None = None      # training-time budget (cumulative over resumes)
    lr: float = 3e-3
    warmup: int = 30
    answers_per_step: int = 4
    anchors_per_answer: int = 8
    eval_every: int = 200
    checkpoint_every: int = 100
    seed: int = 0


class Trainer:
    def __init__(self, model, target, head, vocab, answers, held_out, settings: Settings, folder: Path):
        self.model, self.target, self.head, self.vocab = model, target, head, vocab
        self.answers, self.held_out, self.s, self.folder = answers, held_out, settings, folder
        self.index = vocab_index(vocab, target.lm_head_weight.shape[0])  # token id -> head row
        self.opt = torch.optim.AdamW(model.parameters(), lr=settings.lr, weight_decay=0.0, betas=(0.9, 0.95))
        self.gen = torch.Generator().manual_seed(settings.seed)
        self.step, self.seconds, self.loss = 0, 0.0, float("nan")

    @property
    def progress(self) -> float:
        s = self.s
        by_steps = self.step / s.steps if s.steps else 0.0
        by_time = self.seconds / (60 * s.minutes) if s.minutes else 0.0
        return min(1.0, max(by_steps, by_time))

    def lr(self) -> float:
        warm = min(1.0, (self.step + 1) / self.s.warmup)
        return self.s.lr * warm * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * self.progress)))

    def train_step(self) -> float:
        """One AdamW step over `answers_per_step` answers x `anchors_per_answer` blocks."""
        began = time.process_time()
        for group in self.opt.param_groups:
            group["lr"] = self.lr()
        total, weight = torch.zeros(()), torch.zeros(())
        for _ in range(self.s.answers_per_step):
            answer = self.answers[int(torch.randint(len(self.answers), (1,), generator=self.gen))]
            span = answer.tokens.numel() - answer.prompt_len
            anchors = answer.prompt_len + torch.randint(span, (self.s.anchors_per_answer,), generator=self.gen)
            loss, w = block_loss(self.model, self.target, self.head, self.index, answer, anchors, self.vocab)
            total, weight = total + loss, weight + w
        loss = total / weight.clamp(min=1.0)
        self.opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.opt.step()
        self.step += 1
        self.seconds += time.process_time() - began
        self.loss = float(loss.detach())
        return self.loss

    def evaluate(self) -> float:
        return held_out_tau(self.model, self.target, self.head, self.vocab, self.held_out)

    def run(self, report=None) -> None:
        """Train until progress reaches 1; `report(trainer, tau or None)` after every step."""
        self.model.train()
        while self.progress < 1.0:
            self.train_step()
            tau = self.evaluate() if self.step % self.s.eval_every == 0 else None
            if self.step % self.s.checkpoint_every == 0:
                self.save()
            if report:
                report(self, tau)
        self.save()
        self.model.eval()

    def save(self) -> None:
        state = {"model": self.model.state_dict(), "opt": self.opt.state_dict(), "step": self.step,
                 "seconds": self.seconds, "gen": self.gen.get_state(), "loss": self.loss}
        tmp = self.folder / (CHECKPOINT + ".tmp")
        torch.save(state, tmp)
        tmp.rename(self.folder / CHECKPOINT)  # atomic: a kill mid-write keeps the previous one

    def resume(self) -> bool:
        """Restore the folder's checkpoint, if any; True when one was restored."""
        path = self.folder / CHECKPOINT
        if not path.exists():
            return False
        state = torch.load(path, weights_only=True)
        self.model.load_state_dict(state["model"])
        self.opt.load_state_dict(state["opt"])
        self.step, self.seconds, self.loss = state["step"], state["seconds"], state["loss"]
        self.gen.set_state(state["gen"])
        return True

