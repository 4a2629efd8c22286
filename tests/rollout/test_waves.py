"""Wave planning, plan parsing and resume state: pure, milliseconds."""

import pytest

from ddops.rollout.fleet.waves import (DONE, FAILED, LOCKED, PENDING, REFUSED, REVERT_FAILED, RUNNING,
                                       REVERTED, UNREACHABLE, PlanError, RolloutState, exit_code, parse_plan, plan_waves)

HOSTS = ("h1", "h2", "h3", "h4", "h5")


def test_canary_first_then_waves_of_size():
    assert plan_waves(HOSTS, 1, 2) == (("h1",), ("h2", "h3"), ("h4", "h5"))
    assert plan_waves(HOSTS, 2, 3) == (("h1", "h2"), ("h3", "h4", "h5"))


def test_no_canary_and_oversized_canary():
    assert plan_waves(HOSTS, 0, 4) == (("h1", "h2", "h3", "h4"), ("h5",))
    assert plan_waves(("h1", "h2"), 5, 1) == (("h1", "h2"),)


def test_every_host_exactly_once():
    waves = plan_waves(HOSTS, 1, 3)
    assert sorted(h for w in waves for h in w) == sorted(HOSTS)


def test_plan_parses_hosts_and_overrides():
    plan = parse_plan({"profile": "p", "hosts": ["a", "b"], "canary": 1, "wave_size": 2,
                       "max_failures": 0, "bake_s": 1.5}, "plan.yaml")
    assert (plan.hosts, plan.canary, plan.wave_size, plan.max_failures, plan.bake_s) == \
        (("a", "b"), 1, 2, 0, 1.5)
    assert parse_plan({"profile": "p", "selector": {"role": "serve"}}, "x").selector == \
        (("role", "serve"),)


@pytest.mark.parametrize("data, message", [
    ([], "plan.yaml: expected a mapping"),
    ({"hosts": ["a"]}, "plan.yaml: profile: required"),
    ({"profile": "p"}, "plan.yaml: hosts/selector: give exactly one"),
    ({"profile": "p", "hosts": ["a"], "selector": {"r": "s"}}, "hosts/selector: give exactly one"),
    ({"profile": "p", "hosts": ["a", "a"]}, "hosts: a host is listed twice"),
    ({"profile": "p", "hosts": ["a"], "wave_size": 0}, "wave_size: must be an integer >= 1, got 0"),
    ({"profile": "p", "hosts": ["a"], "canary": "x"}, "canary: must be an integer"),
    ({"profile": "p", "hosts": ["a"], "bake_s": -1}, "bake_s: must be a number of seconds"),
    ({"profile": "p", "hosts": ["a"], "waves": 2}, "plan.yaml: waves: unknown key"),
])
def test_bad_plans_name_the_key(data, message):
    with pytest.raises(PlanError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_plan(data, "plan.yaml")


def test_plan_digest_follows_content_not_path():
    a = parse_plan({"profile": "p", "hosts": ["a"]}, "one.yaml")
    b = parse_plan({"profile": "p", "hosts": ["a"]}, "two.yaml")
    c = parse_plan({"profile": "p", "hosts": ["a", "b"]}, "one.yaml")
    assert a.digest == b.digest != c.digest


def state_of(**statuses):
    plan = parse_plan({"profile": "p", "hosts": list(statuses)}, "x")
    state = RolloutState.start(plan, plan_waves(plan.hosts, 1, 2))
    for host, status in statuses.items():
        state = state.with_host(host, status, changed=status in (DONE, RUNNING))
    return state


def test_resume_skips_finished_hosts_and_retries_interrupted_ones():
    state = state_of(h1=DONE, h2=DONE, h3=RUNNING, h4=PENDING)
    assert state.pending_waves() == [("h3",), ("h4",)]
    assert state_of(h1=DONE, h2=RUNNING, h3=PENDING).pending_waves() == [("h2", "h3")]


def test_state_round_trips_through_json():
    state = state_of(h1=DONE, h2=FAILED, h3=PENDING).with_status("halted")
    assert RolloutState.from_dict(state.to_dict()) == state


def test_halt_beyond_max_failures_and_revert_only_changed_hosts():
    state = state_of(h1=DONE, h2=FAILED, h3=DONE, h4=PENDING)
    assert state.must_halt(0) and not state.must_halt(1)
    assert state.to_revert() == ["h1", "h3"]
    state = state.with_host("h1", DONE, changed=False)
    assert state.to_revert() == ["h3"]


def test_exit_codes_follow_the_ci_contract():
    assert exit_code(state_of(h1=DONE, h2=DONE).with_status("succeeded")) == 0
    assert exit_code(state_of(h1=DONE, h2=FAILED).with_status("halted")) == 1
    assert exit_code(state_of(h1=REVERT_FAILED, h2=FAILED).with_status("halted")) == 3
    assert exit_code(state_of(h1=DONE, h2=LOCKED).with_status("halted")) == 4


def test_a_refusal_is_bad_input_only_while_no_host_changed():
    assert exit_code(state_of(h1=REFUSED, h2=PENDING).with_status("halted")) == 2   # the canary: nothing changed
    assert exit_code(state_of(h1=DONE, h2=REFUSED).with_status("halted")) == 1      # after a change: a failure
    assert exit_code(state_of(h1=REVERTED, h2=REFUSED).with_status("halted")) == 1   # the canary came back
    assert exit_code(state_of(h1=REFUSED, h2=UNREACHABLE).with_status("halted")) == 6
