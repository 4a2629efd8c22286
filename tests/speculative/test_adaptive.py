"""The adaptive controller: picks the setting with the best measured tokens per second, with
hysteresis and periodic exploration; the decoder's forced round speculates whatever it prefers."""

import torch

from serving.speculative.adaptive import Controller, Setting, widths
from serving.speculative.base import Method
from serving.speculative.ddtree import TreeVerifier
from serving.speculative.decoder import SpecDecoder, settings
from serving.speculative.dflash import DFlashDrafter, load_model
from serving.sampling import SamplingParams


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
    return Controller([Setting("plain", 1), Setting("budget 8", 9), Setting("budget 32", 33)], explore_every=10)


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
    cost["plain"] = (1, 0.05)  # 20 tok/s: found by exploration, taken over
    run(c, cost, 60)
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
    decoder = SpecDecoder(target, method, capacity=64, adaptive=True)
    for s in decoder.controller.settings:  # warmed up, plain the clear favourite
        s.rounds, s.tokens, s.seconds = 5, (1.0 if s.rows == 1 else 0.5), 1.0
    decoder.controller.current = decoder.controller.settings[0]
    decoder.start([5, 6, 7], SamplingParams(temperature=0), 2)
    decoder.force_speculation()
    decoder.step()
    assert decoder.controller.settings[-1].rounds == 6 and decoder.times.draft > 0
    decoder.step()  # not forced: the controller's choice, plain
    assert decoder.controller.settings[0].rounds == 6
    assert decoder.server_args["speculative_current_setting"] == "plain"


def test_settings_far_behind_are_explored_rarely():
    c = Controller([Setting("plain", 1), Setting("budget 8", 9), Setting("budget 32", 33)],
                   explore_every=4, far_every=4)
    chosen = run(c, {"plain": (1, 0.10), "budget 8": (1.2, 0.20), "budget 32": (1.2, 0.40)}, 166)
    after_warmup = chosen[6:]  # 2 warm-up rounds each
    assert c.current.label == "plain"
    assert len(after_warmup) - after_warmup.count("plain") == 10  # 40 explorations, 1 in 4 taken
