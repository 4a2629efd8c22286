"""What tune reads from a mirroring candidate's sink, and the time its plan says, from the pace
it records. The same paths run for real in tests/tune/test_lab_tune.py (a mirrored tune, and a
rerun whose wall time is checked against its plan's estimate)."""

from __future__ import annotations

import pytest

from ddops.tune.measure import MIRRORED, Load, Requirements, mirrored_level
from ddops.tune.plan import START_GUESS_S, Pace, Plan
from serving.engine.stats import Usage
from serving.server.mirror_tally import Tally


def test_a_mirrored_level_is_the_sink_s_own_figures_and_its_equality_with_production():
    tally = Tally()
    # production answered (1, 2, 3, 4); the candidate (1, 2, 3, 4) then (1, 2, 9, 9): 6 of 8 tokens agree
    tally.add(True, (1, 2, 3, 4), "length", (1, 2, 3, 4), "length", Usage(5, 4, 2, 4, 0.1, 0.4))
    tally.add(True, (1, 2, 3, 4), "length", (1, 2, 9, 9), "length", Usage(5, 4, 3, 4, 0.2, 0.6))
    tally.failed += 1
    level = mirrored_level(tally.to_dict())
    assert level.concurrency == MIRRORED and level.requests == 3 and level.errors == 1
    assert level.tokens_per_s == pytest.approx(8 / 1.0)          # 8 tokens over the requests' own 1.0 s
    assert level.token_equality == pytest.approx(6 / 8)
    assert level.itl_p50_s == pytest.approx((0.1 + 0.4 / 3) / 2)  # (0.3/3, 0.4/3): their mean
    assert level.ttft_p99_s == pytest.approx(0.1 + 0.1 * 0.99)
    assert Requirements(min_token_equality=1.0).unmet([level]) == [
        "1 of 3 requests failed on mirrored traffic",
        "token equality with production 0.750 < 1.0 on mirrored traffic"]


def _plan(load: Load, pace: Pace, trials: int, measured_before: int = 0) -> Plan:
    return Plan(None, None, "lab-1", "llm-tune.service", 30002, "llm.service", None, load, "throughput",
                Requirements(), "grid", trials, 600.0, "s", None, pace=pace, measured_before=measured_before)


def test_the_plan_s_time_is_the_yardstick_and_each_candidate_left_at_the_host_s_pace():
    load = Load(("a", "b"), (1, 4), 16)                           # 2 prompts x 2 levels x 16 tokens = 64
    pace = Pace(start_s=20.0, token_s=0.05, candidates=3, host="lab-2", runtime="bundled")
    assert _plan(load, pace, trials=3).estimate_s() == pytest.approx(64 * 0.05 + 3 * (20 + 64 * 0.05))
    # a resumed study: only the candidates left, and production's yardstick again
    assert _plan(load, pace, trials=3, measured_before=2).estimate_s() == pytest.approx(3.2 + 23.2)
    assert pace.basis == "measured: 3 bundled candidate(s) started on lab-2 before"
    assert Pace().basis.startswith("guessed") and Pace().start_s == START_GUESS_S
    # mirrored: the traffic sets the pace; the bound is each start and wait, the yardstick's too
    mirrored = Load((), (MIRRORED,), 16, mirrored=True, count=8, wait_s=120.0)
    assert _plan(mirrored, pace, trials=2).estimate_s() == pytest.approx(3 * (20 + 120))
