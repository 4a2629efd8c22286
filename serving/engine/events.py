"""The engine's interface: a `GenerationRequest` in; its listener handed `Delta`s, then one `Finished` or `Failed`."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Callable

from serving.engine.stats import Usage
from serving.engine.stops import StopRule
from serving.sampling import SamplingParams


@dataclass
class GenerationRequest:
    prompt_ids: list[int]
    sampling: SamplingParams
    rule: StopRule
    emit: Callable[[object], None]
    cancelled: threading.Event = field(default_factory=threading.Event)
    submitted: float = field(default_factory=time.perf_counter)   # TTFT counts from here: the HTTP arrival
    probe: bool = False  # /health_generate: its rounds verify the widest setting whatever is preferred


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
