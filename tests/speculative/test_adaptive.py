"""The adaptive controller: picks the setting with the best measured tokens per second, with
hysteresis, climbing over widths and exploration paid from a share of the wall time; the
runner's forced (probe) round speculates whatever it prefers."""

import torch

from serving.speculative.adaptive import Controller, Setting, widths
from serving.speculative.base import Method
from serving.speculative.ddtree import TreeVerifier
from serving.engine import GenerationRequest, StopRule
from serving.engine.batch import BatchRunner
from serving.speculative.dflash import DFlashDrafter, load_model
from serving.speculative.lane import settings
from serving.sampling import SamplingParams
from tests.rounds import scheduler


def run(controller: Controller, cost: dict[str, tuple[float, float]], rounds: int) -> list[str]:
    """Feed `rounds` rounds where setting label -> (tokens per round, seconds per round)."""
    chosen = []
    for _ in range(rounds):
        s = controller.choose()
        tokens, seconds = cost[s.label]
        controller.record(s, tokens, seconds)
        chosen.append(s.label)
    return chosen


def three() -> Controller:
    return Controller([Setting("plain", 1), Setting("budget 8", 9), Setting("budget 32", 33)])


def test_speculation_that_pays_is_chosen():
    c = three()
    chosen = run(c, {"plain": (1, 0.10), "budget 8": (3, 0.15), "budget 32": (3.5, 0.30)}, 60)
    assert c.current.label == "budget 8"
    assert chosen[-20:].count("budget 8") >= 17  # the rest: exploration rounds


def test_speculation_that_does_not_pay_falls_back_to_plain():
    c = three()
    run(c, {"plain": (1, 0.10), "budget 8": (1.2, 0.18), "budget 32": (1.4, 0.30)}, 60)
    assert c.current.label == "plain"


def test_a_small_edge_does_not_switch_and_exploration_notices_change():
    c = three()
    cost = {"plain": (1, 0.10), "budget 8": (2, 0.15), "budget 32": (2, 0.30)}
    run(c, cost, 30)
    assert c.current.label == "budget 8"
    cost["plain"] = (1, 0.0735)  # 13.6 tok/s vs 13.3: inside the 5 % margin
    run(c, cost, 40)
    assert c.current.label == "budget 8"
    cost["plain"] = (1, 0.05)  # 20 tok/s: found by exploration once the budget allows, taken over
    run(c, cost, 200)
    assert c.current.label == "plain"


def test_widths_cover_the_range_up_to_the_configured_one():
    assert widths(64) == [4, 8, 16, 32, 64]
    assert widths(15) == [4, 8, 15]
    assert widths(3) == [3]


def test_forced_round_speculates_while_plain_is_preferred(targets, random_drafts):
    target = targets["llama"]
    drafter = DFlashDrafter(load_model(random_drafts["llama"], torch.float32, "cpu"), target)
    method = Method("under-test", drafter, TreeVerifier(budget=16))
    assert [s.label for s in settings(method, adaptive=True)] == ["plain", "budget 4", "budget 8", "budget 16"]
    assert [s.label for s in settings(method, adaptive=False)] == ["budget 16"]
    small = Method("small", drafter, TreeVerifier(budget=3))  # narrower than the drafter's block
    assert [s.label for s in settings(small, adaptive=False)] == ["budget 3"]
    runner = BatchRunner(target, method, capacity=64, adaptive=True)
    controller = runner.spec.controller(1)
    for s in controller.settings:  # warmed up, plain the clear favourite
        s.rounds = s.measured = 5
        s.tokens, s.seconds = (1.0 if s.rows == 1 else 0.5), (1e-4 if s.rows == 1 else 1.0)
    controller.current = controller.settings[0]
    # a /health_generate probe (its first round is forced); room for full drafts: rounds measured
    steps = scheduler(runner)
    assert steps.admit(GenerationRequest([5, 6, 7], SamplingParams(temperature=0), StopRule(40), lambda e: None,
                                         probe=True), 0.0)
    steps.step()    # the prefill, then the first round
    assert controller.settings[-1].rounds == 6 and runner.spec.times.draft > 0
    steps.step()    # not forced: the controller's choice, plain
    assert controller.settings[0].rounds == 6
    assert runner.server_args["speculative_current_setting"] == "plain"


def five() -> Controller:
    return Controller([Setting("plain", 1)] + [Setting(f"budget {b}", b + 1) for b in (4, 8, 16, 32)])


def seconds_per_token(controller: Controller, cost: dict, tokens: int) -> float:
    made = spent = 0.0
    while made < tokens:
        s = controller.choose()
        k, sec = cost[s.label]
        controller.record(s, k, sec)
        made, spent = made + k, spent + sec
    return spent / made


def test_speculation_that_loses_costs_at_most_the_exploration_share():
    # Every width loses to plain, the wider the worse (a CPU with a weak drafter).
    cost = {"plain": (1, 0.10), "budget 4": (1.2, 0.15), "budget 8": (1.25, 0.2),
            "budget 16": (1.3, 0.25), "budget 32": (1.45, 0.4)}
    for tokens in (200, 2000):
        c = five()
        slowdown = seconds_per_token(c, cost, tokens) / 0.10
        assert c.current.label == "plain"
        assert slowdown <= 1 + c.explore_share + 0.01  # warm-ups included
        assert c.exploring <= c.explore_share * c.spent + 2 * 0.15
        assert c.settings[2].rounds == 0  # climbing: budget 8 is never tried past a losing budget 4


def test_climb_reaches_the_best_width_within_ten_percent():
    # Verify rows nearly free (a GPU): rate grows with width up to budget 16.
    cost = {"plain": (1, 0.02), "budget 4": (2, 0.025), "budget 8": (2.5, 0.026),
            "budget 16": (3.2, 0.028), "budget 32": (3.3, 0.034)}
    c = five()
    rate = 1 / seconds_per_token(c, cost, 200)
    assert c.current.label == "budget 16"
    assert rate >= 0.9 * 3.2 / 0.028


def test_a_cold_first_round_does_not_condemn_a_setting():
    # The process's very first round is slow (allocator, first kernels): plain must still win.
    c = five()
    cost = {"plain": (1, 0.10), "budget 4": (1.1, 0.3), "budget 8": (1.2, 0.4),
            "budget 16": (1.3, 0.5), "budget 32": (1.4, 0.6)}
    first = c.choose()
    c.record(first, 1, 5.0)
    run(c, cost, 100)
    assert c.current.label == "plain"
    assert c.settings[1].rounds <= c.warmup + 1


def test_rounds_cut_short_by_a_request_end_are_not_measured():
    # A width first tried on 1-token request tails (nothing to draft) must not be condemned.
    c = three()
    run(c, {"plain": (1, 0.10), "budget 8": (1, 0.15), "budget 32": (1, 0.3)}, 3)
    for _ in range(5):
        s = c.choose()
        c.record(s, 1, 0.15 if s.rows > 1 else 0.10, full=s.rows == 1)
    assert c.settings[1].rounds > 0 and c.settings[1].measured == 0 and c.spent > 0
    run(c, {"plain": (1, 0.10), "budget 8": (3, 0.15), "budget 32": (3, 0.3)}, 10)
    assert c.current.label == "budget 8"
