"""The adaptive controller: value = tokens per round (from trials, every width at once) over cost
(round seconds over a plain step's); a width is timed only when its trials promise it could
win; hysteresis; back to plain within ~20 rounds of acceptance dropping. Fake clocks here (milliseconds);
the runner's forced (probe) round and a trial over a real drafted tree run on a tiny model."""

import random

import torch

from serving.engine import GenerationRequest, StopRule
from serving.engine.batch import BatchRunner
from serving.engine.scheduler import Scheduler
from serving.sampling import SamplingParams
from serving.speculative.adaptive import Controller, Setting, widths
from serving.speculative.base import Method
from serving.speculative.ddtree import TreeVerifier
from serving.speculative.dflash import DFlashDrafter, load_model
from serving.speculative.lane import settings
from serving.speculative.tree import Trial, chain_tree, heap_tree
from tests.rounds import Ids, scheduler


def tree_controller(budgets=(1, 2, 4, 8, 16, 32)) -> Controller:
    return Controller([Setting("plain", 1)] + [Setting(f"budget {b}", b + 1) for b in budgets])


class World:
    """A machine and a content: a round of r verify rows costs plain + per_row * (r - 1), plus the
    draft pass if it drafts; a drafted tree's walk accepts rows 1..L (a chain-like path)."""

    def __init__(self, plain=0.100, per_row=0.005, draft=0.012, accept=lambda n: 0):
        self.plain, self.per_row, self.draft, self.accept = plain, per_row, draft, accept
        self.n = self.made = self.spent = 0

    def run(self, c: Controller, rounds: int) -> list[str]:
        chosen = []
        for _ in range(rounds):
            s = c.choose()
            drafted = s.rows > 1 or c.trial
            path = list(range(1, self.accept(self.n) + 1))
            tokens = 1 + sum(r < s.rows for r in path)
            seconds = self.plain + self.per_row * (s.rows - 1) + (self.draft if drafted else 0.0)
            c.record(s, tokens, seconds, draft_seconds=self.draft if drafted else 0.0)
            if drafted:     # in the runtime each width's walk ends at its bonus; here at once
                for width in c.settings[1:]:
                    c.observe(width.rows, sum(r < width.rows for r in path))
            self.n, self.made, self.spent = self.n + 1, self.made + tokens, self.spent + seconds
            chosen.append(s.label)
        return chosen

    @property
    def slowdown(self) -> float:
        """Seconds per token over plain decoding's."""
        return self.spent / self.made / self.plain


def test_speculation_that_pays_is_chosen_at_the_best_width():
    # accepts 3 drafts a round: budget 4 is the narrowest setting here that takes them all
    c, w = tree_controller(), World(accept=lambda n: 3)
    chosen = w.run(c, 200)
    assert c.current.label == "budget 4"
    # the rest: plain steps re-timed (one in plain_gap rounds) and measuring windows, which verify
    # the widest (16 tokens: 4 rounds), as rarely as keeps its extra cost under 1.5 %
    rest = [label for label in chosen[-50:] if label != "budget 4"]
    assert rest.count("plain") <= 2 and rest.count("budget 32") <= 8 and len(rest) == rest.count("plain") + \
        rest.count("budget 32")
    best = 4 / (1 + 0.12 + 0.2)                        # tokens per plain step's time at budget 4
    assert 1 / w.slowdown >= 0.9 * best


def test_a_draft_whose_rounds_vary_is_run_at_its_best_width_not_left_by_chance():
    # a real draft's accepted length varies round to round (here geometric: each next draft
    # accepted with p 0.5, 1 on average); an average that follows the last few trials sits below
    # the mean most of the time and left the best width for plain by chance: 0.72-0.79x of the
    # best fixed width over 1000 rounds at alpha 0.4, 0.97-0.99x at 0.1 (seeds 0-4)
    rng = random.Random(3)

    def geometric(n):
        k = 0
        while k < 15 and rng.random() < 0.5:
            k += 1
        return k

    speeds = {}
    for budget in (None, 1, 2, 4, 8, 16, 32):
        rng.seed(3)
        c = tree_controller() if budget is None else Controller([Setting(f"budget {budget}", budget + 1)])
        w = World(accept=geometric)
        w.run(c, 1000)
        speeds[budget] = 1 / w.slowdown
    best = max(v for b, v in speeds.items() if b)
    assert best > 1.4 and speeds[None] >= 0.95 * best


def test_windows_open_on_tokens_alone_and_weigh_the_gap_they_stand_for():
    """A window is owed every gap of tokens, whatever the content: 64 while plain runs and a width
    is near paying, 128 once none has been, and while a width runs as rarely as keeps the widest's
    extra cost under measure_share; each weighs its gap in trial gaps, and a round that runs past
    the point one was owed carries its excess to the next."""
    c = tree_controller()
    for s in c.settings[1:]:
        s.trials = c.min_trials             # past the back-to-back windows of the start
    opened = []
    for _ in range(300):                    # plain, one token a round, nothing near paying
        s = c.choose()
        if c.measuring and c.windows > len(opened):
            opened.append((c.position, c.window_weight))
        c.record(s, 1, 0.1)
    gaps = [b[0] - a[0] for a, b in zip(opened, opened[1:])]
    # the first at once (after the two plain steps that time a step), then every 64 tokens (the
    # two steps' credit carried), then every 128 once min_trials windows found nothing near paying
    assert opened[0][0] == 2 and gaps[:2] == [62, 64] and gaps[-1] == 128
    assert [w for _, w in opened][:3] == [1.0, 1.0, 1.0] and opened[-1][1] == 2.0
    c.current, c.hopeless = c.settings[4], 0                            # budget 4 runs, 4 tokens a round
    c.settings[4].cost, c.settings[-1].cost = 1.0, 1.5                  # the widest costs half again as much
    assert c._measure_gap() == 16 * 0.5 / c.measure_share               # 533 tokens
    c.credit = 0.0
    c.record(c.settings[4], 4, 0.1)                                     # 4 tokens owe 4 / 533 of a window
    assert c.credit == 4 / c._measure_gap()
    c.settings[-1].cost = 1.0                                           # a GPU's flat verify pass
    assert c._measure_gap() == c.trial_gap


def test_speculation_that_loses_costs_its_trials_and_little_more():
    # a weak draft on unseen content: one accepted draft in eight rounds, dearer than it gives
    # (budget 1: 1.125 tokens a round for 1.17 plain steps)
    c, w = tree_controller(), World(accept=lambda n: n % 8 == 0)
    w.run(c, 400)
    assert c.current.label == "plain"
    # trials: a draft pass (12 %) in each round of a 16-token window every 128 (64 until the
    # windows keep finding nothing), half of it the burn-in of the widest's chain for the figure
    assert w.slowdown <= 1.035
    # a lucky run of trials may send it to time budget 1; never a wider tree, which accepts no more
    assert all(s.rounds == 0 for s in c.settings[2:])
    c, w = tree_controller(), World(accept=lambda n: 0)   # random words: nothing is ever accepted
    w.run(c, 400)
    # a draft pass in each round of its windows: 16 tokens every 128 once they keep finding nothing
    assert all(s.rounds == 0 for s in c.settings[1:]) and w.slowdown <= 1.025


def test_trials_thin_out_while_they_keep_finding_nothing():
    c, w = tree_controller(), World(accept=lambda n: 0)
    trials = []
    for _ in range(400):
        w.run(c, 1)
        trials.append(c.trial)
    window = c.trial_window        # trials come in windows of consecutive rounds
    assert sum(trials[-200:]) <= window * (200 // c.quiet_trial_gap + 1) < window * (200 // c.trial_gap)
    assert all(s.rounds == 0 for s in c.settings[1:])


def test_quiet_windows_cost_what_measure_share_allows_where_the_draft_pass_is_dear():
    # a bf16 target on a CPU: a plain step is cheap, so a window's round (plain + a draft pass)
    # costs 1.4 plain steps; content the draft cannot predict. Windows every quiet_trial_gap
    # tokens would cost 16 * 0.4 / 144 = 4.4 % of the time
    c, w = tree_controller(), World(draft=0.040, accept=lambda n: 0)
    w.run(c, 1000)
    assert abs(c.window_cost - 0.4) < 1e-9 and c._trial_gap() == c.trial_window * c.window_cost / c.measure_share
    spent, made = w.spent, w.made
    w.run(c, 4000)
    slowdown = (w.spent - spent) / (w.made - made) / w.plain
    assert slowdown <= 1 + c.measure_share * 1.1 and all(s.rounds == 0 for s in c.settings[1:])


def test_a_width_that_could_not_take_over_from_plain_does_not_keep_windows_dense():
    # trials promise budget 1 a value of 1.03 at its least possible cost: near plain, short of
    # the margin a width needs to take over, so windows thin out as if nothing were near
    c = tree_controller()
    c.plain_seconds, c.draft_seconds = 0.100, 0.012
    for s in c.settings[1:]:
        s.trials, s.accepted = c.min_trials, 0.0
    c.settings[1].accepted = 1.03 * 1.12 - 1
    assert 1.0 < c._near() < 1 + c.margin
    for _ in range(c.min_trials):
        c.credit = 1.0
        assert c._opens_window()
    assert c.hopeless == c.min_trials and c._trial_gap() == c.quiet_trial_gap


def test_a_width_timed_and_found_dear_is_left_and_the_loss_stays_in_budget():
    # trials promise the wider trees pay at their least possible cost, but verify rows are dear
    c, w = tree_controller(), World(per_row=0.1, accept=lambda n: 2)
    w.run(c, 600)
    assert c.current.label == "plain"
    assert any(s.measured for s in c.settings[1:])
    assert w.slowdown <= 1 + c.explore_share + 0.03


def test_back_to_plain_within_tens_of_rounds_when_acceptance_drops():
    accepting = {"on": True}
    c, w = tree_controller(), World(accept=lambda n: 3 if accepting["on"] else 0)
    w.run(c, 150)
    assert c.current.label == "budget 4"
    accepting["on"] = False                            # the prompt changed: a list of random words
    chosen = w.run(c, 60)
    # via a narrower, cheaper width or not: an average that trusts ~10 trials (alpha 0.1) takes
    # ~20 rounds to fall from 3 drafts to below what budget 4 costs, and stays there
    assert chosen.index("plain") <= 25 and c.current.label == "plain"
    assert chosen[30:].count("plain") >= 29


def test_speculation_is_taken_up_again_when_the_content_turns_predictable():
    accepting = {"on": False}
    c, w = tree_controller(), World(accept=lambda n: 3 if accepting["on"] else 0)
    w.run(c, 100)
    assert c.current.label == "plain"
    accepting["on"] = True
    # the next window (windows come every 128 tokens here, nothing having paid) finds it; the
    # window runs its 16 tokens out, then budget 4 is timed and taken; the widest's first
    # measuring window follows (its cost unknown, so soon)
    chosen = w.run(c, 80)
    assert c.current.label == "budget 4" and chosen[-20:].count("budget 4") >= 16
    assert set(chosen[-20:]) <= {"budget 4", "budget 32", "plain"}


def test_a_small_edge_does_not_switch():
    # budget 1 (rows 2) worth 1.03 plain steps: inside the 5 % margin
    c, w = tree_controller((1,)), World(per_row=0.0, draft=0.0, accept=lambda n: 0)
    c.settings[1].accepted, c.settings[1].trials = 0.9, 10
    w.plain = 0.1
    for _ in range(3):
        s = c.choose()
        c.record(s, 1, 0.1)
    c.settings[1].cost, c.settings[1].measured, c.settings[1].rounds = 1.85, 5, 5
    c.choose()
    assert c.current.label == "plain"
    c.settings[1].cost = 1.7                            # 1.9 / 1.7 = 1.12 plain steps
    c.choose()
    assert c.current.label == "budget 1"


def test_a_cold_first_round_does_not_condemn_plain_or_a_width():
    c, w = tree_controller(), World(accept=lambda n: 3)
    first = c.choose()
    c.record(first, 1, 5.0)                            # the process's first round: allocator, kernels
    w.run(c, 100)
    assert c.plain_seconds < 0.2 and c.current.label == "budget 4"


def test_rounds_cut_short_by_a_request_end_are_not_measured():
    c = tree_controller((8,))
    s = c.settings[1]
    c.plain_seconds = 0.1
    for _ in range(3):
        c.record(s, 1, 0.15, full=False)
    assert s.rounds == 3 and s.measured == 0 and s.cost is None and c.spent > 0


def test_a_fixed_setting_always_runs_and_never_trials():
    c = Controller([Setting("budget 16", 17)])
    for _ in range(20):
        assert c.choose().label == "budget 16" and not c.trial
        c.record(c.settings[0], 2, 0.1)


def test_widths_are_half_octaves_up_to_the_configured_one():
    assert widths(32) == [1, 2, 3, 4, 6, 8, 12, 16, 24, 32]
    assert widths(15) == [1, 2, 3, 4, 6, 8, 12, 15]
    assert widths(8, 2) == [2, 3, 4, 6, 8]
    assert widths(1) == [1]


def test_a_trial_scores_every_width_from_one_tree():
    # depth 1: tokens 10 (logp -0.1), 11; depth 2: 20, 21; depth 3: 30, 31
    logp = [[-0.1, -2.5], [-0.2, -2.0], [-0.3, -1.9]]
    tokens = [[10, 11], [20, 21], [30, 31]]
    big = heap_tree(5, logp, tokens, 6)
    for budget in range(1, 6):           # a smaller budget's tree is the big tree's first rows
        assert big.prefix(budget + 1) == heap_tree(5, logp, tokens, budget)
    assert chain_tree(5, [1, 2, 3]).prefix(3) == chain_tree(5, [1, 2])
    trial = Trial(big, [2, 3, len(big)])
    assert trial.feed([10]) == []        # one round committed 10: every width's walk goes on
    # then 20, at row 2: a width of 2 rows (root and row 1) ends there, 20 its bonus; then a token
    # no child names ends the others, each with what it accepted
    assert trial.feed([20, 99, 7]) == [(2, 1, False), (3, 2, False), (len(big), 2, False)] and trial.done
    assert trial.path == [1, 2]
    rows = {big.tokens[r]: r for r in trial.path}
    assert [trial.accepted(r) for r in (1, rows[10] + 1, rows[20] + 1, len(big))] == [0, 1, 2, 2]
    leaf = Trial(chain_tree(5, [1, 2]), [3])
    assert leaf.feed([1, 2]) == [] and leaf.feed([8]) == [(3, 2, True)]   # after a leaf, its bonus ends it


def greedy_usages(runner, prompts: list[list[int]], max_new: int) -> list:
    """Each prompt at T=0 through the real scheduler, one after another: their Usage records."""
    got: list = []
    steps = Scheduler(runner, Ids(), lambda r, event: r.emit(event), got.append)
    for prompt in prompts:
        assert steps.admit(GenerationRequest(prompt, SamplingParams(temperature=0), StopRule(max_new),
                                             lambda e: None), 0.0)
        while steps.running:
            steps.step()
    return got


def test_forced_round_speculates_while_plain_is_preferred(targets, random_drafts):
    target = targets["llama"]
    drafter = DFlashDrafter(load_model(random_drafts["llama"], torch.float32, "cpu"), target)
    method = Method("under-test", drafter, TreeVerifier(budget=16))
    assert [s.label for s in settings(method, adaptive=True)] == \
        ["plain"] + [f"budget {b}" for b in (1, 2, 3, 4, 6, 8, 12, 16)]
    assert [s.label for s in settings(method, adaptive=False)] == ["budget 16"]
    small = Method("small", drafter, TreeVerifier(budget=3))  # narrower than the drafter's block
    assert [s.label for s in settings(small, adaptive=False)] == ["budget 3"]
    runner = BatchRunner(target, method, capacity=64, adaptive=True)
    controller = runner.spec.controller(1)
    for s in controller.settings:  # warmed up, plain the clear favourite
        s.rounds = s.measured = s.trials = 5
        s.accepted, s.cost = 0.1, 10.0
    controller.plain_seconds = 1e-4
    # a /health_generate probe (every round of it forced); room for full drafts: rounds measured
    steps = scheduler(runner)
    assert steps.admit(GenerationRequest([5, 6, 7], SamplingParams(temperature=0), StopRule(24), lambda e: None,
                                         probe=True), 0.0)
    steps.step()    # the prefill, then the first round
    assert controller.settings[-1].rounds == 6 and runner.spec.times.draft > 0
    # the sequence's first round is where every width's fixed run starts: its trial counts ...
    assert controller.settings[1].trials == controller.settings[-1].trials == 6
    steps.step()    # ... and the widest's second, drafted at its bonus; not budget 1's, whose round
    # ended there only because the widest's did (its next would be picked by how this one fared)
    assert controller.settings[-1].rounds == 7 and controller.settings[-1].trials == 7
    assert controller.settings[1].trials == 6
    while steps.running:
        steps.step()
    assert steps.admit(GenerationRequest([5, 6, 7], SamplingParams(temperature=0), StopRule(24), lambda e: None), 0.0)
    steps.step()
    steps.step()    # not a probe: the controller's choice, plain (the prefill's step ran one too)
    assert controller.settings[0].rounds == 7
    assert runner.server_args["speculative_current_setting"] == "plain"


def test_a_sequence_reports_its_drafts_acceptance_whatever_its_rounds_ran(targets, distilled_drafts):
    """Usage.trials/trial_accepted come from the sequence's trials, so an adaptive runtime that runs
    plain rounds (a mirroring shadow, docs/mirror.md) still says what its draft accepts there; a
    fixed setting's trials are its own rounds."""
    target = targets["llama"]
    drafter = DFlashDrafter(load_model(distilled_drafts["llama"], torch.float32, "cpu"), target)
    method = Method("under-test", drafter, TreeVerifier(budget=16))
    prompts = [[5 + i, 6 + 2 * i, 7, 9 + i] for i in range(6)]

    def usages(runner) -> list:
        return greedy_usages(runner, prompts, 40)

    adaptive = BatchRunner(target, method, capacity=64, adaptive=True)
    controller = adaptive.spec.controller(1)
    for s in controller.settings:  # warmed up, plain the clear favourite: only plain rounds and trials
        s.rounds = s.measured = s.trials = 5
        s.accepted, s.cost = 0.1, 10.0
    controller.plain_seconds = 1e-4
    plain_run = usages(adaptive)
    assert all(u.accepted == u.rounds for u in plain_run)                 # every round committed one token
    trials = sum(u.trials for u in plain_run)
    assert trials > 0 and 1 + sum(u.trial_accepted for u in plain_run) / trials > 1.0   # the draft accepts
    fixed = usages(BatchRunner(target, method, capacity=64, adaptive=False))
    assert all(u.trials > 0 for u in fixed)
    assert sum(u.accepted for u in fixed) / sum(u.rounds for u in fixed) > 1.0
    rate = 1 + sum(u.trial_accepted for u in fixed) / sum(u.trials for u in fixed)
    as_run = sum(u.accepted for u in fixed) / sum(u.rounds for u in fixed)
    assert abs(rate - as_run) < 0.5          # trials of a fixed setting are its rounds (less cut last ones)


def test_trials_at_every_width_are_the_rounds_a_fixed_run_of_that_width_makes(targets, distilled_drafts):
    """At T=0 the trials an adaptive runtime drafts while it decodes plainly score each width with
    exactly the rounds a fixed run of that width makes on the same prompts: same count, same
    drafts accepted. (Trials started at every position instead read this draft at 4.1 tokens a
    round where budget 16 realizes 2.1; heavier-on-drops averaging read real drafts too low.)"""
    target = targets["llama"]
    drafter = DFlashDrafter(load_model(distilled_drafts["llama"], torch.float32, "cpu"), target)
    prompts = [[5 + i, 6 + 2 * i, 7, 9 + i] for i in range(4)]

    def run(runner) -> list:
        return greedy_usages(runner, prompts, 48)

    adaptive = BatchRunner(target, Method("m", drafter, TreeVerifier(budget=16)), capacity=96, adaptive=True)
    controller = adaptive.spec.controller(1)
    for s in controller.settings:   # plain the clear favourite, its trial window never closing
        s.rounds = s.measured = 5
        s.accepted, s.cost = 0.1, 10.0
    controller.plain_seconds, controller.window_end = 1e-4, 10 ** 9
    plain = run(adaptive)
    assert all(u.accepted == u.rounds for u in plain)                      # only plain rounds ran
    trials = {s.rows - 1: (s.trials, s.trial_drafts) for s in controller.settings if not s.plain}
    for budget in (1, 4, 16):
        fixed = BatchRunner(target, Method("m", drafter, TreeVerifier(budget=budget)), capacity=96)
        usage = run(fixed)
        width = fixed.spec.controller(1).settings[0]
        assert (width.trials, width.trial_drafts) == trials[budget]
        # its trials are its rounds but those of each request's last tokens, too few for a whole block
        rounds, block = sum(u.rounds for u in usage), drafter.needs.draft_tokens
        assert rounds - len(prompts) * block <= width.trials < rounds
        realized = sum(u.accepted for u in usage) / sum(u.rounds for u in usage)
        assert abs(width.accept_length - realized) < 0.1 and width.accept_length > 1.1
