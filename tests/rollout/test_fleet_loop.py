"""The rollout loop with scripted host outcomes (the lab test runs the same loop on real hosts)."""

import threading

from ddops.rollout.fleet.loop import Limits, Outcome, Rollout, StateFile, resume_or_start
from ddops.rollout.fleet.waves import (DONE, FAILED, REVERTED, RUNNING, RolloutState, exit_code,
                                 parse_plan, plan_waves)


def make(tmp_path, hosts, canary=1, wave=2):
    plan = parse_plan({"profile": "p", "hosts": hosts}, str(tmp_path / "plan.yaml"))
    state = RolloutState.start(plan, plan_waves(plan.hosts, canary, wave), canary)
    return plan, state, StateFile.for_plan(tmp_path, plan)


class Hosts:
    """Scripted hosts: records deploy/revert order; `fail` hosts fail their gate."""

    def __init__(self, fail=(), interrupt_after=None):
        self.fail, self.calls, self.lock = set(fail), [], threading.Lock()
        self.interrupt_after = interrupt_after

    def deploy(self, host):
        with self.lock:
            self.calls.append(("deploy", host))
            if self.interrupt_after is not None and len(self.calls) > self.interrupt_after:
                raise KeyboardInterrupt
        if host in self.fail:
            return Outcome(FAILED, changed=False, detail="gate failed, reverted")
        return Outcome(DONE, changed=True, detail="gate passed", before=f"{host}-v1")

    def revert(self, host, host_state):
        with self.lock:
            self.calls.append(("revert", host, host_state.before))
        return Outcome(REVERTED, detail=f"back to {host_state.before}")


def run(state, store, hosts, max_failures=0, bake_s=0.0, events=None):
    slept = []
    rollout = Rollout(state, store, Limits(max_failures, bake_s, 4), hosts.deploy, hosts.revert,
                      on_change=(lambda s, h: events.append((h, s.hosts[h].status) if h else s.status))
                      if events is not None else (lambda s, h: None), sleep=slept.append)
    return rollout.run(), slept


def test_all_hosts_pass_canary_first_with_bake_between_waves(tmp_path):
    _, state, store = make(tmp_path, ["h1", "h2", "h3", "h4"])
    hosts = Hosts()
    final, slept = run(state, store, hosts, bake_s=5.0)
    assert final.status == "succeeded" and exit_code(final) == 0
    assert hosts.calls[0] == ("deploy", "h1")  # canary alone, before anyone else
    assert slept == [5.0, 5.0]  # canary | h2 h3 | h4: bake between waves, not after the last
    assert store.load() == final


def test_failure_past_max_stops_and_reverts_only_changed_hosts(tmp_path):
    _, state, store = make(tmp_path, ["h1", "h2", "h3", "h4", "h5"])
    hosts = Hosts(fail={"h3"})
    final, _ = run(state, store, hosts, max_failures=0)
    assert final.status == "halted" and exit_code(final) == 1
    assert ("deploy", "h4") not in hosts.calls and ("deploy", "h5") not in hosts.calls
    reverts = sorted(c for c in hosts.calls if c[0] == "revert")
    assert reverts == [("revert", "h1", "h1-v1"), ("revert", "h2", "h2-v1")]
    assert {h: s.status for h, s in final.hosts.items()} == \
        {"h1": REVERTED, "h2": REVERTED, "h3": FAILED, "h4": "pending", "h5": "pending"}


def test_failures_within_tolerance_continue_but_exit_nonzero(tmp_path):
    _, state, store = make(tmp_path, ["h1", "h2", "h3"])
    final, _ = run(state, store, Hosts(fail={"h2"}), max_failures=1)
    assert final.status == "failed" and final.hosts["h3"].status == DONE and exit_code(final) == 1


def test_interrupted_rollout_resumes_without_redeploying_finished_hosts(tmp_path):
    plan, state, store = make(tmp_path, ["h1", "h2", "h3", "h4"], canary=1, wave=1)
    first = Hosts(interrupt_after=2)
    try:
        run(state, store, first)
    except KeyboardInterrupt:
        pass
    saved = store.load()
    assert saved.hosts["h1"].status == DONE and saved.hosts["h2"].status == DONE
    assert saved.hosts["h3"].status == RUNNING and not saved.finished
    fresh = RolloutState.start(plan, plan_waves(plan.hosts, 1, 1), 1)
    resumed, was_resumed = resume_or_start(store, fresh, restart=False)
    assert was_resumed
    second = Hosts()
    final, _ = run(resumed, store, second)
    assert [c[1] for c in second.calls] == ["h3", "h4"] and final.status == "succeeded"
    assert resume_or_start(store, fresh, restart=False) == (fresh, False)  # finished: start anew


def test_progress_events_reach_the_view_in_order(tmp_path):
    _, state, store = make(tmp_path, ["h1", "h2"], canary=1, wave=1)
    events = []
    run(state, store, Hosts(), events=events)
    assert events == [("h1", RUNNING), ("h1", DONE), ("h2", RUNNING), ("h2", DONE), "succeeded"]


def test_status_tells_a_rollout_whose_runner_died_and_not_one_running_paused_or_ended(tmp_path, monkeypatch):
    """Fast beside tests/rollout/test_lab_faults.py's killed rollout: which state files
    `ddops status` names (run_plan.interrupted_rollouts)."""
    import os
    import subprocess
    from dataclasses import replace

    from ddops.deploy.lock import Holder
    from ddops.rollout.fleet.run_plan import interrupted_rollouts
    from ddops.rollout.fleet.waves import PAUSED

    monkeypatch.setenv("DDOPS_STATE", str(tmp_path))
    plan, state, _ = make(tmp_path, ["h1", "h2"], canary=1, wave=1)
    store = StateFile.for_plan(tmp_path, plan)
    dead = subprocess.Popen(["true"])
    dead.wait()
    runner = {**Holder.here("ddops rollout plan.yaml").as_dict(), "pid": dead.pid}
    store.save(replace(state.with_host("h1", DONE, changed=True), runner=runner))
    [left] = interrupted_rollouts("h1")
    assert left["next"] == "ddops rollout plan.yaml (resumes it)" and left["changed"] == ["h1"]
    assert interrupted_rollouts("h2") and not interrupted_rollouts("h3")
    for other in (replace(state, runner={**runner, "pid": os.getpid()}),     # its runner is alive
                  replace(state, runner=runner, status=PAUSED),              # waits for --approve
                  replace(state, runner=runner, status="succeeded")):        # ended
        store.save(other)
        assert interrupted_rollouts("h1") == []


def test_a_revert_that_failed_keeps_the_rollout_reverting_and_its_rerun_tries_again(tmp_path):
    """The halt's revert of the canary fails (its link dropped, say): the rollout is not finished
    but reverting (exit 3), so the same command resumes it and reverts the canary, rather than
    starting afresh past a host left on the new profile (ddops.lab.faults --fault drop found it)."""
    from ddops.rollout.fleet.waves import REVERT_FAILED

    plan, state, store = make(tmp_path, ["h1", "h2"], canary=1, wave=1)

    class FirstRevertFails(Hosts):
        def revert(self, host, host_state):
            if not any(c[0] == "revert" for c in self.calls):
                self.calls.append(("revert", host, host_state.before))
                return Outcome(REVERT_FAILED, detail="unreachable while reverting")
            return super().revert(host, host_state)

    hosts = FirstRevertFails(fail={"h2"})
    halted, _ = run(state, store, hosts)
    assert halted.status == "reverting" and not halted.finished and exit_code(halted) == 3
    assert halted.hosts["h1"].status == REVERT_FAILED and halted.hosts["h1"].changed
    resumed, was_resumed = resume_or_start(store, RolloutState.start(plan, plan_waves(plan.hosts, 1, 1), 1), False)
    assert was_resumed
    final, _ = run(resumed, store, hosts)
    assert final.status == "halted" and final.hosts["h1"].status == REVERTED
    assert [c for c in hosts.calls if c[0] == "revert"] == [("revert", "h1", "h1-v1")] * 2


def test_a_host_whose_own_deploy_broke_off_halts_the_rollout_as_before(tmp_path):
    """A deploy that lost its host mid-way (the engine's revert-failed, nothing changed by the
    rollout's own count) is not a revert the halt failed: the rollout ends halted, and its rerun
    starts afresh, where the deploy engine recovers the host first."""
    from ddops.rollout.fleet.waves import REVERT_FAILED

    plan, state, store = make(tmp_path, ["h1", "h2"], canary=1, wave=1)

    class BrokeOff(Hosts):
        def deploy(self, host):
            self.calls.append(("deploy", host))
            return Outcome(REVERT_FAILED, changed=False, detail="connection lost")

    final, _ = run(state, store, BrokeOff())
    assert final.status == "halted" and final.finished and exit_code(final) == 3
