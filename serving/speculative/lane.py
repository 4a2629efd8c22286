"""Speculative rounds for one sequence at a time inside the batch runner (serving.engine.batch).

The runner keeps, per sequence, the target features of every committed token (captured by
prefill, batched plain steps and speculative rounds alike). Before a round, the one drafter
catches up on what it has not seen of that sequence, or starts over from all of its features
when it last drafted for another one; the round itself is `SpecDecoder.step` run on the
sequence's own slice of the KV pool, its own sampling parameters and draws.
"""

from __future__ import annotations

import torch

from .base import Method
from .decoder import SpecDecoder


class _Tee:
    """The drafter, with every `extend` also kept in the current sequence's feature list."""

    def __init__(self, drafter):
        self.inner, self.needs, self.feature_width = drafter, drafter.needs, drafter.feature_width
        self.vocab = drafter.vocab
        self.sink: list | None = None

    def reserve(self, capacity: int) -> None:
        self.inner.reserve(capacity)

    def reset(self) -> None:
        self.inner.reset()

    def extend(self, features) -> None:
        self.sink.append(features)
        self.inner.extend(features)

    def propose(self, bonus, start, depth):
        return self.inner.propose(bonus, start, depth)


class SpecLane:
    def __init__(self, target, method: Method, adaptive: bool = False):
        self.tee = _Tee(method.drafter)
        self.decoder = SpecDecoder(target, Method(method.name, self.tee, method.verifier), capacity=0,
                                   adaptive=adaptive)
        self.decoder.cache = None               # rounds run on the sequence's slice of the pool
        self.layers = method.needs.target_layers
        self.width = method.drafter.feature_width
        self.owner = None                       # the sequence the drafter's context belongs to

    @property
    def server_args(self) -> dict:
        return self.decoder.server_args

    def record(self, seq, hidden) -> None:
        """Target features hidden [n, >= width] of the sequence's next n committed tokens."""
        seq.state.setdefault("features", []).append(hidden[:, : self.width])

    def forget(self, seq) -> None:
        if self.owner is seq:
            self.owner = None

    def round(self, seq) -> list[int]:
        features = seq.state["features"]
        seen = seq.state.get("seen", 0) if self.owner is seq else 0
        if self.owner is not seq:
            self.tee.reset()
            self.owner = seq
        for f in features[seen:]:
            self.tee.inner.extend(f)
        d, bonus = self.decoder, seq.state["next"]
        d.cache, d.sampling, d.draws = seq.state["cache"], seq.request.sampling, seq.state["draws"]
        d.bonus, d.start_pos, d.remaining = bonus, d.cache.length, seq.remaining
        d.bonus_on_device = torch.tensor([bonus], dtype=torch.long, device=d.cache.k.device)
        self.tee.sink = features
        if seq.request.probe and seq.rounds == 0:
            d.force_speculation()
        try:
            committed = d.step()
        finally:
            d.cache, self.tee.sink = None, None
        seq.state["next"], seq.state["seen"] = d.bonus, len(features)
        return committed
