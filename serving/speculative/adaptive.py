"""Adaptive speculation: per round, plain decoding or one of the method's verify widths.

Pure (no torch): settings in, a choice out, measurements back. Each setting keeps moving
averages of tokens committed per round and seconds per round; the choice is the setting
with the best tokens per second, changed only when another beats it by `margin`
(hysteresis). Every `explore_every` rounds the least recently measured setting runs once,
so a setting that became better (other content, a cooler CPU) is noticed; a setting measured
at under `far` of the current one's rate is only explored every `far_every`-th time (each
such round costs more than it can teach). Whatever is
chosen, output is lossless: every setting is plain decoding or an ordinary speculative
round.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Setting:
    """One choice: `rows` target rows per verify pass (1 = plain decoding: no draft)."""

    label: str
    rows: int
    rounds: int = 0
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
    settings: list[Setting]
    alpha: float = 0.2  # weight of the newest round in the moving averages
    margin: float = 0.05  # a challenger must be this much faster to take over
    warmup: int = 2  # rounds each setting runs before the first comparison
    explore_every: int = 32
    far: float = 0.7
    far_every: int = 4
    round: int = 0
    explorations: int = 0
    current: Setting = field(init=False)

    def __post_init__(self):
        self.current = self.settings[0]

    def choose(self) -> Setting:
        """The setting for the next round."""
        self.round += 1
        cold = [s for s in self.settings if s.rounds < self.warmup]
        if cold:
            return cold[0]
        if self.round % self.explore_every == 0:
            return self._explore()
        return self.current

    def _explore(self) -> Setting:
        others = [s for s in self.settings if s is not self.current]
        near = [s for s in others if s.rate >= self.far * self.current.rate]
        self.explorations += 1
        pool = others if self.explorations % self.far_every == 0 else near
        return min(pool, key=lambda s: s.last_round, default=self.current)

    def record(self, setting: Setting, tokens: int, seconds: float) -> None:
        """A finished round: tokens committed (bonus included) and its wall time."""
        if setting.rounds == 0:
            setting.tokens, setting.seconds = float(tokens), seconds
        else:
            a = self.alpha
            setting.tokens += a * (tokens - setting.tokens)
            setting.seconds += a * (seconds - setting.seconds)
        setting.rounds += 1
        setting.last_round = self.round
        best = max(self.settings, key=lambda s: s.rate)
        if best is not self.current and best.rate > self.current.rate * (1 + self.margin):
            self.current = best

    def report(self) -> list[dict]:
        return [s.report() for s in self.settings]
