"""The target's own answers to chat prompts, with what the draft trains on, cached on disk.

An `Answer` is one sequence the target ran: the chat-templated prompt and the target's
response (greedy, or sampled with a seed), the target's features at the draft's tapped layers
after every position, and its greedy pick after every position. Features come from the same
forwards that generate the response (prefill, then batched decode steps of the runtime's
`serving.models.batched`), so data costs one target pass per token. Tokens and picks are
what the runtime's plain decoding gives (tests/speculative/test_drafter.py checks it against the
engine); the response's last drawn token is not fed, so every kept token has its features.

Cache: answers are written in shards of 32, each named by a digest of everything it depends
on (target weights, taps, its prompts, sampling, length); an interrupted run keeps its
finished shards and continues with the next, and a longer prompt list reuses the shorter one's.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import torch

from serving.models import batched
from serving.sampling import PositionalDraws, SamplingParams

DATA_VERSION = 1  # bump when what a shard holds changes


@dataclass
class Answer:
    tokens: torch.Tensor  # [S] long: prompt + response tokens, all fed to the target
    feats: torch.Tensor   # [S, taps * H] fp16: target features after each position
    picks: torch.Tensor   # [S] long: target greedy pick after each position
    prompt_len: int       # response starts at this index


@dataclass(frozen=True)
class Request:
    prompt: list[int]
    sampling: SamplingParams
    max_new: int


def target_digest(target_dir: Path, taps) -> str:
    """What every shard depends on besides its own requests: the target's weights and the taps."""
    digest = hashlib.sha256(f"v{DATA_VERSION} taps={list(taps)}".encode())
    with open(Path(target_dir) / "model.safetensors", "rb") as f:
        for block in iter(lambda: f.read(1 << 24), b""):
            digest.update(block)
    return digest.hexdigest()


def shard_name(base: str, requests: list[Request]) -> str:
    """A shard's file name: a digest of the target's and of its requests (prompt, sampling,
    length), so a longer request list reuses every shard it shares with a shorter one."""
    digest = hashlib.sha256(base.encode())
    for r in requests:
        s = r.sampling
        digest.update(json.dumps([r.prompt, s.temperature, s.top_p, s.top_k, s.seed, r.max_new]).encode())
    return f"shard-{digest.hexdigest()[:16]}.pt"


@torch.inference_mode()
def answer_batch(target, requests: list[Request], taps, stop_ids: frozenset) -> list[Answer]:
    """Each request's answer: prefill one by one, then one batched decode step per token for
    every sequence still running (the runtime's batched plain decoding)."""
    live = [_prefill(target, r, taps) for r in requests]
    running = [s for s in live if not s.done(stop_ids)]
    while running:
        tokens = torch.tensor([s.next for s in running])
        positions = torch.tensor([s.cache.length for s in running])
        logits, hidden = batched.decode_step(target, tokens, positions, [s.cache for s in running], taps)
        for b, s in enumerate(running):
            s.cache.commit(1)
            s.feed(s.next, hidden[b:b + 1], logits[b:b + 1].argmax(-1), logits[b:b + 1])
        running = [s for s in running if not s.done(stop_ids)]
    return [s.answer() for s in live]


class _Live:
    """One sequence being generated: its cache, draws, and what it has fed so far."""

    def __init__(self, target, request: Request):
        self.request, self.prompt_len = request, len(request.prompt)
        self.cache = target.new_cache(len(request.prompt) + request.max_new + 1)
        self.draws = PositionalDraws(request.sampling.seed or 0)
        self.tokens, self.feats, self.picks = [], [], []
        self.next = None

    def feed(self, tokens, hidden: torch.Tensor, picks: torch.Tensor, last: torch.Tensor) -> None:
        """Record tokens fed at the next positions with their features [n, F] and picks [n];
        draw the token after them from `last` [1, V] (as the runtime does: keyed by position)."""
        self.tokens += [tokens] if isinstance(tokens, int) else list(tokens)
        self.feats.append(hidden.to(torch.float16))
        self.picks.append(picks)
        self.next = int(self.draws.choose(last, self.request.sampling, [len(self.tokens)])[0])

    def done(self, stop_ids: frozenset) -> bool:
        generated = len(self.tokens) - self.prompt_len + 1  # the drawn `next` counts
        return self.next in stop_ids or generated >= self.request.max_new

    def answer(self) -> Answer:
        return Answer(torch.tensor(self.tokens), torch.cat(self.feats), torch.cat(self.picks), self.prompt_len)


def _prefill(target, request: Request, taps) -> _Live:
    """Prompt features for every position, the LM head for the last only (no anchor lies in the
    prompt, so its other picks are never labels: they are stored as -1)."""
    live = _Live(target, request)
    n = len(request.prompt)
    logits, hidden = target.forward(torch.tensor(request.prompt), torch.arange(n), live.cache, capture=taps,
                                    last_only=True)
    live.cache.commit(n)
    picks = torch.cat([torch.full((n - 1,), -1), logits.argmax(-1)])
    live.feed(request.prompt, hidden, picks, logits)
    return live


def save_shard(path: Path, answers: list[Answer]) -> None:
    tmp = path.with_suffix(".tmp")
    torch.save([vars(a) for a in answers], tmp)
    tmp.rename(path)  # atomic: an interrupted write leaves no half shard


def load_shard(path: Path) -> list[Answer]:
    return [Answer(**a) for a in torch.load(path, weights_only=True)]


def cached_answers(target, requests: list[Request], taps, base: str, stop_ids: frozenset, folder: Path,
                   shard: int = 32, on_shard=None) -> list[Answer]:
    """All requests' answers, `shard` at a time, each shard read from `folder` when there (so an
    interrupted run continues with the first missing one); base: `target_digest`."""
    folder.mkdir(parents=True, exist_ok=True)
    out = []
    for i in range(0, len(requests), shard):
        part = requests[i:i + shard]
        path = folder / shard_name(base, part)
        if not path.exists():
            save_shard(path, answer_batch(target, part, taps, stop_ids))
        out += load_shard(path)
        if on_shard:
            on_shard(min(i + shard, len(requests)), len(requests))
    return out
