"""One request through the real scheduler and batch runner, its committed tokens round by round
(tests that count what each speculative round accepted)."""

from __future__ import annotations

from serving.engine import Delta, GenerationRequest, StopRule
from serving.engine.scheduler import Scheduler


class Ids:
    """Token ids as text: every round's tokens make new text, so each round is one Delta."""

    @staticmethod
    def decode(ids) -> str:
        return " ".join(map(str, ids))


def rounds(runner, prompt: list[int], sampling, max_new: int) -> list[list[int]]:
    """[first token], then each decode round's committed tokens (the last cut at max_new)."""
    events: list = []
    request = GenerationRequest(prompt, sampling, StopRule(max_new), events.append)
    scheduler = Scheduler(runner, Ids(), lambda r, event: r.emit(event), lambda usage: None)
    assert scheduler.admit(request, request.submitted)
    while scheduler.running:
        scheduler.step()
    return [list(e.token_ids) for e in events if isinstance(e, Delta)]


def tokens(runner, prompt: list[int], sampling, max_new: int) -> list[int]:
    return [t for r in rounds(runner, prompt, sampling, max_new) for t in r]


def scheduler(runner) -> Scheduler:
    """A scheduler over `runner` that hands each event to its request's `emit`."""
    return Scheduler(runner, Ids(), lambda r, event: r.emit(event), lambda usage: None)
