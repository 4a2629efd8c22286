"""What the engine hands a request's listener: `Delta`s, then one `Finished` or `Failed`."""

from __future__ import annotations

from dataclasses import dataclass

from serving.engine.stats import Usage


@dataclass(frozen=True)
class Delta:
    text: str
    token_ids: tuple[int, ...]


@dataclass(frozen=True)
class Finished:
    text: str
    token_ids: tuple[int, ...]
    finish_reason: str
    usage: Usage


@dataclass(frozen=True)
class Failed:
    message: str
