"""Adaptive speculation: per round, plain decoding or one of the method's verify widths.

Pure (no torch): settings in, a choice out, measurements back. Each setting keeps moving
averages of tokens committed per round and seconds per round; the choice is the measured
setting with the best tokens per second, changed only when another beats it by `margin`
(hysteresis).

Settings are ordered by verify rows (plain first) and measured by climbing: only the
neighbours of the current setting are tried, on the assumption that rate is unimodal in
width (a wider tree accepts more and costs more). A never-measured neighbour in the direction
of the last move is tried at once (the climb goes on while it pays); every other trial is an
exploration, paid for from a budget: what rounds off the current setting lost against it
(their seconds minus the seconds the current setting would have taken for their tokens) may
add up to at most `explore_share` of the wall time so far. So on content where speculation
loses, the controller costs at most about that share against plain decoding, warm-up
included; a setting about as fast as the current one is explored almost for free, and one
that became better (other content, a cooler CPU) is noticed. Whatever is chosen, output
is lossless: every setting is plain decoding or an ordinary speculative round.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Setting:
    """One choice: `rows` target rows per verify pass (1 = plain decoding: no draft)."""

    label: str
    rows: int
    rounds: int = 0  # rounds run
    measured: int = 0  # rounds run in full (see Controller.record): warm-up counts these
    tokens: float = 0.0  # moving average of tokens committed per round
    seconds: float = 0.0  # moving average of seconds per round
    last_round: int = -1  # controller round it last ran in

    @property
    def rate(self) -> float:
        """Measured tokens per second (0 until measured)."""
        return self.tokens / self.seconds if self.seconds > 0 else 0.0

    def report(self) -> dict:
        return {"setting": self.label, "verify_rows": self.rows, "rounds": self.rounds,
                "tokens_per_round": round(self.tokens, 3), "tokens_per_s": round(self.rate, 2)}


def widths(largest: int, smallest: int = 4) -> list[int]:
    """Verify widths to try: powers of two from `smallest` below `largest`, and `largest`."""
    out, w = [], smallest
    while w < largest:
        out.append(w)
        w *= 2
    return out + [largest]


@dataclass
class Controller:
    settings: list[Setting]  # ordered by verify rows; settings[0] is where measuring starts
    alpha: float = 0.2  # weight of the newest round in the current setting's moving averages
    alpha_explored: float = 0.5  # ... and in an explored one's (its average is older: let it move)
    margin: float = 0.05  # a challenger must be this much faster to take over
    warmup: int = 3  # rounds a setting runs before it is compared (the first one unmeasured)
    explore_share: float = 0.02  # most of the wall time lost to rounds off the current setting
    explore_gap: int = 8  # fewest rounds between two explorations
    round: int = 0
    spent: float = 0.0  # seconds of all rounds
    exploring: float = 0.0  # seconds those rounds lost against the current setting
    current: Setting = field(init=False)
    heading: int = 1  # direction of the last move: +1 wider, -1 narrower
    last_exploration: int = 0

    def __post_init__(self):
        self.current = self.settings[0]

    def choose(self) -> Setting:
        """The setting for the next round."""
        self.round += 1
        if self.current.measured < self.warmup:
            return self.current
        started = [s for s in self._near() if 0 < s.measured < self.warmup]
        if started:
            return started[0]  # finish a started warm-up: one round teaches little
        ahead = self._neighbour(self.heading)
        if ahead is not None and ahead.measured == 0:
            return ahead  # climbing: current is the start, or got there by a move that paid
        if self.round - self.last_exploration >= self.explore_gap:
            pick = self._explore()
            if pick is not None:
                self.last_exploration = self.round
                return pick
        return self.current

    def _neighbour(self, step: int) -> Setting | None:
        i = self.settings.index(self.current) + step
        return self.settings[i] if 0 <= i < len(self.settings) else None

    def _near(self) -> list[Setting]:
        return [s for s in (self._neighbour(-1), self._neighbour(1)) if s is not None]

    def _explore(self) -> Setting | None:
        """The least recently run neighbour whose expected loss the budget still covers."""
        room = self.explore_share * self.spent - self.exploring
        affordable = [s for s in self._near() if self._expected_loss(s) <= room]
        return min(affordable, key=lambda s: s.last_round, default=None)

    def _lost(self, tokens: float, seconds: float) -> float:
        """Seconds a round of `tokens` in `seconds` loses against the current setting's rate."""
        if self.current.rate <= 0:
            return seconds
        return max(0.0, seconds - tokens / self.current.rate)

    def _expected_loss(self, setting: Setting) -> float:
        if setting.seconds <= 0:  # never measured: a round of the current setting, as far as known
            return self.current.seconds
        return self._lost(setting.tokens, setting.seconds)

    def record(self, setting: Setting, tokens: int, seconds: float, full: bool = True) -> None:
        """A finished round: tokens committed (bonus included) and its wall time. `full`: it
        could draft its whole depth; a round cut short by a request's last tokens costs what it
        cost but says nothing of the setting (it is not measured: a 1-token tail would
        condemn a width)."""
        if setting is not self.current:
            self.exploring += self._lost(tokens, seconds)
        self.spent += seconds
        setting.rounds += 1
        setting.last_round = self.round
        if full:
            self._measure(setting, tokens, seconds)
            setting.measured += 1
            self._maybe_move()

    def _measure(self, setting: Setting, tokens: int, seconds: float) -> None:
        # A setting's first round primes it (first kernels of that width, allocator, the
        # drafter catching up on features) and is not averaged: one slow outlier would
        # otherwise condemn a setting, and make it look too dear to explore again.
        if setting.measured == 0:
            return
        if setting.measured == 1:
            setting.tokens, setting.seconds = float(tokens), seconds
            return
        a = self.alpha if setting is self.current else self.alpha_explored
        setting.tokens += a * (tokens - setting.tokens)
        setting.seconds += a * (seconds - setting.seconds)

    def _maybe_move(self) -> None:
        warm = [s for s in self.settings if s.measured >= self.warmup]
        best = max(warm, key=lambda s: s.rate, default=self.current)
        if best is self.current or best.rate <= self.current.rate * (1 + self.margin):
            return
        self.heading = 1 if best.rows > self.current.rows else -1
        self.current = best

    def report(self) -> list[dict]:
        return [s.report() for s in self.settings]
