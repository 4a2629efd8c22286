"""The rollout loop with a scripted watcher and pauses (real hosts: tests/rollout/test_lab_watch.py)."""

import pytest

from ddops.rollout.fleet.loop import Limits, Rollout
from ddops.rollout.fleet.waves import (FAILED, PAUSED, REVERTED, PlanError, exit_code, parse_plan,
                                 pause_waves, plan_waves)
from tests.rollout.test_fleet_loop import Hosts, make


class Watcher:
    """Fails the hosts in `bad`; records which hosts were baked against which unchanged ones."""

    def __init__(self, bad=()):
        self.bad, self.baked = set(bad), []

    def bake(self, hosts, unchanged):
        self.baked.append((list(hosts), list(unchanged)))
        return {h: {"status": "failed" if h in self.bad else "passed", "passed": h not in self.bad,
                    "reasons": ["error_ratio 0.5 > max 0.05"] if h in self.bad else []} for h in hosts}


def rollout(state, store, hosts, watcher=None, pauses=(), max_failures=0, events=None):
    return Rollout(state, store, Limits(max_failures, 10.0, 4), hosts.deploy, hosts.revert,
                   sleep=lambda s: None, watcher=watcher, pause_after=pauses,
                   on_event=(lambda kind, fields: events.append(kind)) if events is not None
                   else (lambda kind, fields: None))


def test_canary_failing_its_analysis_is_reverted_and_halts_before_the_next_wave(tmp_path):
    _, state, store = make(tmp_path, ["h1", "h2", "h3"])
    hosts, watcher, events = Hosts(), Watcher(bad={"h1"}), []
    final = rollout(state, store, hosts, watcher, events=events).run()
    assert final.status == "halted" and exit_code(final) == 1
    assert hosts.calls == [("deploy", "h1"), ("revert", "h1", "h1-v1")]  # h2, h3 never touched
    assert final.hosts["h1"].status == FAILED and not final.hosts["h1"].changed
    assert final.hosts["h1"].detail.startswith("analysis failed: error_ratio 0.5 > max 0.05")
    assert watcher.baked == [(["h1"], ["h2", "h3"])]
    assert events == ["wave", "analysis", "revert", "wave_done", "halt", "finish"]


def test_every_wave_is_watched_including_the_last(tmp_path):
    _, state, store = make(tmp_path, ["h1", "h2", "h3"])
    watcher = Watcher()
    final = rollout(state, store, Hosts(), watcher).run()
    assert final.status == "succeeded"
    assert watcher.baked == [(["h1"], ["h2", "h3"]), (["h2", "h3"], [])]


def test_pause_after_canary_then_approve_continues_and_abort_reverts(tmp_path):
    plan, state, store = make(tmp_path, ["h1", "h2", "h3"])
    hosts = Hosts()
    paused = rollout(state, store, hosts, pauses=(0,)).run()
    assert paused.status == PAUSED and paused.paused_at == 0 and exit_code(paused) == 5
    assert store.load() == paused and hosts.calls == [("deploy", "h1")]

    resumed = rollout(store.load(), store, hosts, pauses=(0,))
    resumed.approve()
    approved = resumed.run()
    assert approved.status == "succeeded" and approved.approved == (0,)
    assert [c[1] for c in hosts.calls] == ["h1", "h2", "h3"]  # the canary was not deployed again

    _, state, store = make(tmp_path / "again", ["h1", "h2", "h3"])
    hosts = Hosts()
    paused = rollout(state, store, hosts, pauses=(0,)).run()
    aborted = rollout(paused, store, hosts, pauses=(0,)).abort()
    assert aborted.status == "aborted" and exit_code(aborted) == 1
    assert hosts.calls == [("deploy", "h1"), ("revert", "h1", "h1-v1")]
    assert aborted.hosts["h1"].status == REVERTED


def test_pause_points_count_waves_as_the_table_shows_them():
    waves = plan_waves(("a", "b", "c", "d"), 1, 1)
    assert pause_waves(("canary", "2"), waves, 1, "p") == (0, 2)
    assert pause_waves(("1",), plan_waves(("a", "b"), 0, 1), 0, "p") == (0,)
    with pytest.raises(PlanError, match="no wave after it"):
        pause_waves(("3",), waves, 1, "p")
    with pytest.raises(PlanError, match="no canary"):
        pause_waves(("canary",), plan_waves(("a", "b"), 0, 1), 0, "p")


def test_plan_analysis_errors_name_the_key():
    with pytest.raises(PlanError, match=r"analysis\.checks\.0\.metric"):
        parse_plan({"profile": "p", "hosts": ["a"], "analysis": {"checks": [{"metric": "nope", "max": 1}]}}, "p.yaml")
    with pytest.raises(PlanError, match="at least one of max"):
        parse_plan({"profile": "p", "hosts": ["a"], "analysis": {"checks": [{"metric": "ttft_p95"}]}}, "p.yaml")
    with pytest.raises(PlanError, match="pause_after"):
        parse_plan({"profile": "p", "hosts": ["a"], "pause_after": "later"}, "p.yaml")
