"""Adaptive speculation: per round, plain decoding or one of the method's verify widths.

Pure (no torch): settings in, a choice out, measurements back. The choice is the setting that
commits the most tokens per plain step's worth of time, its value

    value(w) = tokens per round at w / cost(w),   cost(w) = seconds per round at w / seconds per plain step

(plain: 1 / 1). The two factors are measured apart, because they change apart:

- Tokens per round depend on the content (code, prose, a list of numbers) and change from
  prompt to prompt. They come from trials (serving.speculative.tree.Trial): a drafted tree
  followed along the tokens the sequence then commits. The first r rows of that tree are the
  tree of r rows, so one trial is a round of every width whose last round has ended, whatever
  width was verified. A width's trial counts only when it starts at that width's last bonus,
  where a fixed run of it would start a round (its chain): at T=0 a width's counted trials are
  exactly the rounds a fixed run of it makes over the same tokens. Where a round starts is not
  independent of what it accepts: trials started at every position read a draft at 4.1 tokens
  a round where its fixed rounds realize 2.1. So a chain goes on only through rounds whose end
  its bonus had to be: a plain round's one token, or a round that verified that width.
- Measuring windows: every `trial_gap` tokens of a sequence (once several in a row found no
  width that could take over from plain, as rarely as keeps their draft passes under
  `measure_share`, at least `quiet_trial_gap`; while a width runs, as rarely as keeps the
  widest's dearer rounds under `measure_share`; at most `measure_gap`), whatever the content,
  `trial_window` tokens run as the window's: while plain runs they draft without verifying
  (every width's chain goes on through them), while a width runs they verify the widest. What
  the server says its draft accepts (the widest width's tokens a round) comes from the widest's
  rounds that start in a window after its first `burn_in` tokens, each weighted by the tokens
  its window stands for: a sample of the content drawn as a fixed run's rounds are. Rounds the
  controller chose are not such a sample (it runs a width while the content suits it), nor are
  rounds a window's first trial starts wherever it opened (where the draft does well, one round
  eats the window). Each answer's first round counts as well
  (serving.speculative.lane.counts_for). On 128 prompts the tiny test pair's figure read
  2.34-2.68 for the 2.57 a fixed run of budget 16 realizes; counted from the rounds the
  controller chose, 1.6 to 4.0.
- Cost depends on the machine (rows per verify pass, the draft pass, the load). A width's
  cost is measured by running it: its round seconds over the moving average of plain steps.
  Both sides slow down alike under load, so the ratio holds where raw tokens/s would not.

A width is run only to measure its cost, and only when its measured acceptance could win even
at the cheapest cost it can have (plain plus the draft pass, or the cost of a narrower width
already measured), and while the time such rounds lost against the current setting stays
under `explore_share` of all round time. A setting takes over when its value beats the
current one's by `margin` (hysteresis). While a width runs, a plain step is re-timed every
`plain_gap` rounds. So where speculation loses, the controller costs the trials' draft passes
plus at most explore_share against plain decoding, warm-up included. Whatever it picks, output
is lossless: every setting is plain decoding or an ordinary speculative round.
"""

from __future__ import annotations

from dataclasses import dataclass, field

STEPS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512)  # half octaves


@dataclass
class Setting:
    """One choice: `rows` target rows per verify pass (1 = plain decoding: no draft)."""

    label: str
    rows: int
    rounds: int = 0  # rounds run
    accepted: float | None = None  # moving average of drafts a trial's first `rows` rows accepted
    trials: int = 0
    trial_drafts: int = 0  # drafts all its trials accepted: trial_drafts / trials is what it accepts
    cost: float | None = None  # moving average of round seconds over a plain step's (plain: 1)
    measured: int = 0  # rounds that fed `cost` (the first round of a width primes it, unmeasured)
    last_round: int = -1  # controller round it last ran in

    @property
    def plain(self) -> bool:
        return self.rows == 1

    @property
    def tokens(self) -> float:
        """Tokens committed per round (bonus included), as measured by trials; 0 until then."""
        if self.plain:
            return 1.0
        return 1.0 + self.accepted if self.accepted is not None else 0.0

    @property
    def accept_length(self) -> float | None:
        """Tokens per round over all its trials (bonus included): what a fixed run of it accepts."""
        if self.plain:
            return 1.0
        return 1.0 + self.trial_drafts / self.trials if self.trials else None

    def report(self, plain_seconds: float | None) -> dict:
        cost = 1.0 if self.plain else self.cost
        rate = self.tokens / (cost * plain_seconds) if cost and plain_seconds else 0.0
        accept = self.accept_length
        return {"setting": self.label, "verify_rows": self.rows, "rounds": self.rounds,
                "tokens_per_round": round(self.tokens, 3), "tokens_per_s": round(rate, 2),
                "cost": round(cost, 3) if cost else None, "trials": self.trials,
                "accept_length": round(accept, 3) if accept is not None else None}


def widths(largest: int, smallest: int = 1) -> list[int]:
    """Widths to try: half octaves (1, 2, 3, 4, 6, 8, 12, ...) from `smallest` below `largest`,
    and `largest`. Trials measure every width at once, so a fine grid costs only the widths
    that look worth timing."""
    return [w for w in STEPS if smallest <= w < largest] + [largest]


def _average(old: float | None, new: float, alpha: float) -> float:
    return new if old is None else old + alpha * (new - old)


@dataclass
class Controller:
    settings: list[Setting]  # ordered by verify rows; with several, settings[0] is plain
    alpha_tokens: float = 0.1  # weight of the newest trial: the same up and down keeps the average
    # unbiased (heavier drops read a 1.4-token draft as 1.1). A round's accepted length varies widely
    # (0 or several), and an average of the last few trials (0.4) sits below the mean most of the
    # time, so the best width was left for plain by chance (0.72-0.79x of it); ~10 trials hold it,
    # at the price of ~20 rounds to notice content the draft stops predicting
    alpha_cost: float = 0.2  # weight of the newest round in the costs (the machine moves slowly)
    margin: float = 0.05  # a challenger must be this much more valuable to take over
    warmup: int = 2  # measured rounds before a width's cost is trusted
    explore_share: float = 0.03  # most of the round time lost to rounds off the current setting
    explore_gap: int = 1  # fewest rounds between two exploring rounds
    allowance: float = 4.0  # plain steps' worth of loss the budget starts with
    trial_window: int = 16  # a measuring window spans this many tokens (a sequence's) ...
    burn_in: int = 8  # ... of which the rounds that start in the first this many count for no figure ...
    trial_gap: int = 64  # ... and one opens every this many while plain runs ...
    quiet_trial_gap: int = 128  # ... this many once `min_trials` windows in a row found no width near paying ...
    measure_gap: int = 1024  # ... and at most this many while a width runs (its windows verify the widest) ...
    measure_share: float = 0.015  # ... as often as keeps what those dearer rounds cost under this share
    min_trials: int = 3  # trials before a width's acceptance may send the controller to time it
    plain_gap: int = 32  # while a width runs, a plain step is re-timed this often
    retime_gap: int = 256  # a width not run for this many rounds may be timed again (the load moved)
    churn: bool = False  # tests: a different setting every round, each one a trial
    round: int = 0
    spent: float = 0.0  # seconds of all rounds
    exploring: float = 0.0  # seconds rounds off the current setting lost against it
    plain_seconds: float | None = None  # moving average of a plain step's seconds
    draft_seconds: float | None = None  # moving average of a draft pass's seconds
    window_cost: float | None = None  # moving average of what a plain round that drafts costs beyond a plain step
    trial: bool = False  # the round just chosen drafts (for a trial) even if it verifies nothing
    current: Setting = field(init=False)
    trying: Setting | None = None  # a width being timed
    measuring: bool = False  # the round just chosen is a window's: its trials say what the draft accepts
    position: float = 0.0  # tokens committed per sequence so far (the batch's mean)
    credit: float = 1.0  # windows owed (the first opens at once): each token adds 1 / its gap
    window_end: float = 0.0  # the open window lasts until this position
    window_weight: float = 1.0  # the tokens the open window stands for, in trial gaps
    windows: int = 0  # windows opened so far (the open one's number)
    hopeless: int = 0  # windows in a row opened while no width could take over from plain
    last_exploration: int = 0

    def __post_init__(self):
        self.current = self.settings[0]

    @property
    def fixed(self) -> bool:
        return len(self.settings) == 1

    @property
    def base(self) -> Setting:
        return self.settings[0]

    def choose(self) -> Setting:
        """The setting for the next round; `trial` says whether a plain round drafts."""
        self.round += 1
        self.trial = self.measuring = False
        if self.fixed:      # every round is one the operator chose: each measures the draft
            self.measuring = True
            return self.current
        if self.churn:
            self.trial = True
            return min(self.settings, key=lambda s: s.last_round)
        if self.base.rounds < 2:  # a plain step is the unit of cost: time one first (the first primes)
            return self.base
        if self.trying is not None and (self.trying.measured >= self.warmup or not self._can_explore()):
            self.trying = None
        if self.trying is None:
            self._settle()
        if self.position < self.window_end or self._opens_window():
            return self._measure()
        if self.trying is not None:
            return self._explore(self.trying)
        if not self.current.plain and self.round - self.base.last_round >= self.plain_gap:
            return self._explore(self.base)
        pick = self._promising()
        if pick is not None:
            self.trying = pick
            return self._explore(pick)
        return self.current

    def _opens_window(self) -> bool:
        """Windows open on tokens alone, before anything the controller would pick, so where
        they fall does not follow the content. Each token committed owes 1 / the gap of the
        setting it ran under (`credit`); a window opens when a whole one is owed and weighs that
        gap (`window_weight`, in trial gaps): where windows are sparser (nothing near paying, a
        dear widest) each stands for more tokens, so no stretch of content counts more than its
        share. (Weighing a window by the tokens since the last one gave a stretch of plain
        rounds the weight of the width's window that ended it: SmolLM2's draft read 1.66 for 1.34.)"""
        if self.credit < 1.0:
            return False
        self.credit -= 1.0
        self.window_weight, self.windows = self._trial_gap() / self.trial_gap, self.windows + 1
        self.window_end = self.position + self.trial_window
        if self.current.plain:
            self.hopeless = 0 if self._near() > 1.0 + self.margin else self.hopeless + 1
        return True

    def _measure(self) -> Setting:
        """A window's round. Its trials say what the draft accepts (the server's figure), because
        windows sample the content as a fixed run's rounds do; the rounds the controller picks
        do not: it runs a width while the content suits it (a width it ran read 3.6-4.0 tokens
        a round where a fixed run of it realized 2.3-2.5), and it leaves plain where the draft
        does well (windows opened only while plain ran read the widest at 1.8 for 2.5). While
        plain runs a window's rounds draft without verifying, so every width's trials chain
        through them (one round's bonus is the next one's root); while a width runs they verify
        the widest, whose rounds chain through the window."""
        self.measuring = True
        if self.current.plain:
            self.trial = True
            return self.current
        return self.settings[-1]

    def value(self, setting: Setting) -> float | None:
        """Tokens per plain step's time (plain: 1); None until both factors are measured."""
        if setting.plain:
            return 1.0
        if setting.accepted is None or setting.measured < self.warmup or not setting.cost:
            return None
        return setting.tokens / setting.cost

    def floor(self, setting: Setting) -> float:
        """The least cost `setting` can have: plain plus the draft pass, and no less than a
        narrower width measured (a wider verify pass costs at least as much)."""
        draft = self.draft_seconds / self.plain_seconds if self.draft_seconds and self.plain_seconds else 0.0
        narrower = [s.cost for s in self.settings
                    if not s.plain and s.rows <= setting.rows and s.measured >= self.warmup and s.cost]
        return max([1.0 + draft] + narrower)

    def _near(self) -> float:
        """The best value a width's trials promise at its least possible cost (0 before any)."""
        return max((s.tokens / self.floor(s) for s in self.settings if not s.plain and s.accepted is not None),
                   default=0.0)

    def _trial_gap(self) -> int:
        """Windows back to back until a few trials have scored the content; less often while
        they keep finding no width close (on content the draft cannot predict, each one's draft
        passes are most of what speculation costs), and while a width runs as `_measure_gap`
        says. Each window weighs its gap, so a sparser stretch still counts for its tokens."""
        if min((s.trials for s in self.settings if not s.plain), default=0) < self.min_trials:
            return self.trial_window       # windows back to back
        if not self.current.plain:
            return self._measure_gap()
        return self._quiet_gap() if self.hopeless >= self.min_trials else self.trial_gap

    def _quiet_gap(self) -> float:
        """While no width could take over, windows as rarely as keeps what their rounds cost
        beyond plain steps (`window_cost`) under `measure_share` of the time, never more often
        than `quiet_trial_gap` nor more rarely than `measure_gap`: where a plain step is cheap
        beside the draft pass (SmolLM2 in bf16 on a CPU, a window's round 1.14-1.28 plain
        steps), windows every 128 tokens cost 1.6-3.1 %."""
        priced = self.trial_window * (self.window_cost or 0.0) / self.measure_share
        return min(self.measure_gap, max(self.quiet_trial_gap, priced))

    def _measure_gap(self) -> float:
        """While a width runs, a window verifies the widest instead: as often as the plain
        windows where that costs nearly nothing (a GPU's verify pass), less often where the
        widest is dearer than the width running, so its extra cost stays under `measure_share`
        of the time (windows weigh by their gap, so this spares time, not correctness)."""
        widest = self.settings[-1]
        extra = max(0.0, (widest.cost or self.floor(widest)) / (self.current.cost or 1.0) - 1.0)
        return min(self.measure_gap, max(self.trial_gap, self.trial_window * extra / self.measure_share))

    def _settle(self) -> None:
        """Move to the most valuable measured setting if it beats the current one by `margin`."""
        known = [(v, s) for s in self.settings if (v := self.value(s)) is not None]
        best_value, best = max(known, key=lambda vs: vs[0])
        here = self.value(self.current)
        if best is not self.current and (here is None or best_value > here * (1 + self.margin)):
            self.current = best

    def _promising(self) -> Setting | None:
        """The width whose trials promise the most value at its least possible cost, if that could
        beat the current setting, its cost is not yet measured, and the budget allows a round."""
        here = self.value(self.current) or 1.0
        hopes = [(s.tokens / self.floor(s), s) for s in self.settings if not s.plain and s.trials >= self.min_trials
                 and (s.measured < self.warmup or self.round - s.last_round > self.retime_gap)]
        hopes = [(v, s) for v, s in hopes if v > here * (1 + self.margin)]
        if not hopes or not self._can_explore():
            return None
        pick = max(hopes, key=lambda vs: vs[0])[1]
        if pick.measured >= self.warmup:  # timed long ago: time it afresh
            pick.cost, pick.measured = None, 0
        return pick

    def _can_explore(self) -> bool:
        if self.round - self.last_exploration < self.explore_gap:
            return False
        # the budget (a share of all round time, and `allowance` plain steps to start with, so a
        # width that promises much is timed at once) must cover one more round of the current setting
        step = self.plain_seconds or 0.0
        here = (self.current.cost or 1.0) * step
        return self.exploring + here <= self.explore_share * (self.spent + here) + self.allowance * step

    def _explore(self, setting: Setting) -> Setting:
        self.last_exploration = self.round
        return setting

    def _lost(self, tokens: float, seconds: float) -> float:
        """Seconds a round of `tokens` in `seconds` lost against the current setting."""
        here = self.value(self.current)
        if not here or not self.plain_seconds:
            return 0.0
        return max(0.0, seconds - tokens * self.plain_seconds / here)

    def record(self, setting: Setting, tokens: int, seconds: float, full: bool = True,
               draft_seconds: float = 0.0, sequences: int = 1) -> None:
        """A finished round: tokens committed (bonus included) by its `sequences`, its wall time,
        and of that the draft pass's. `full`: every sequence could draft the setting's whole
        depth; a round cut short by a request's last tokens costs what it cost but says nothing
        of the setting."""
        if setting is not self.current and not self.churn:
            self.exploring += self._lost(tokens, seconds)
        self.spent += seconds
        self.position += tokens / sequences
        self.credit += tokens / sequences / self._trial_gap()
        setting.rounds += 1
        setting.last_round = self.round
        if draft_seconds > 0:
            self.draft_seconds = _average(self.draft_seconds, draft_seconds, self.alpha_cost)
        if setting.plain:
            if setting.rounds > 1:  # the first plain round primes (allocator, first kernels)
                step = seconds - draft_seconds
                if self.plain_seconds is not None:
                    step = min(step, 3 * self.plain_seconds)  # one stall must not make widths look cheap
                self.plain_seconds = _average(self.plain_seconds, step, self.alpha_cost)
                if draft_seconds > 0:   # a window's round: what drafting without verifying costs
                    self.window_cost = _average(self.window_cost, max(0.0, seconds / self.plain_seconds - 1.0),
                                                self.alpha_cost)
        elif full and setting.rounds > 1 and self.plain_seconds:
            # a width's first rounds are averaged alike, as its first trials are: the second round
            # of a new shape is often still slow, and at alpha it would weigh 80 % of the figure
            setting.cost = _average(setting.cost, seconds / self.plain_seconds,
                                    max(self.alpha_cost, 1 / (setting.measured + 1)))
            setting.measured += 1

    def observe(self, rows: int, accepted: int) -> None:
        """A finished trial round of the width of `rows` verify rows: the drafts it accepted."""
        for s in self.settings:
            if s.rows == rows and not s.plain:   # the first trials are averaged alike: one lucky walk promises nothing
                s.accepted = _average(s.accepted, accepted, max(self.alpha_tokens, 1 / (s.trials + 1)))
                s.trials, s.trial_drafts = s.trials + 1, s.trial_drafts + accepted

    def report(self) -> list[dict]:
        return [s.report(self.plain_seconds) for s in self.settings]
