"""Pure cores of deploy: facts parsing, planning (diffs, masking, no-change), gate decisions."""

import json

import httpx

from ddops.deploy.desired import api_key_of, unit_argv
from ddops.deploy.facts import Facts, UnitState, facts_of
from ddops.deploy.gate import (GateSpec, _acceptance, check_acceptance, check_server_info, check_smoke,
                               check_unit, endpoint)
from ddops.deploy.history import next_dirname
from ddops.deploy.plan import Desired, make_plan

UNIT = "[Service]\nExecStart=/opt/ddops/venv/bin/python -m serving --model-path /m --host 0.0.0.0 --port 30001\n"
ENV = "OMP_NUM_THREADS=1\nDDOPS_API_KEY=sk-very-secret\n"
DESIRED = Desired("llm.service", "/etc/systemd/system/llm.service", UNIT, "/etc/ddops/llm.env", ENV,
                  "cpu-ddtree", "abc123")


def facts(unit=None, env=None, active="inactive", pending=None):
    return Facts("llm.service", unit, env, UnitState(active=active), pending, (), 0)


def test_fresh_host_plans_every_step_with_a_creating_diff():
    plan = make_plan(DESIRED, facts())
    actions = [s.action for s in plan.steps]
    assert actions == ["backup", "write-unit", "write-env", "reload-enable", "restart", "gate", "record"]
    assert plan.changed and plan.unit_diff.startswith("--- /dev/null")
    assert "is new: a revert removes it" in plan.steps[0].detail


def test_systemctl_steps_carry_the_exact_command_apply_runs():
    plan = make_plan(DESIRED, facts())
    commands = {s.action: s.command for s in plan.steps if s.command}
    assert commands == {"reload-enable": "systemctl daemon-reload && systemctl enable llm.service 2>&1",
                        "restart": "systemctl reset-failed llm.service 2>/dev/null; systemctl restart llm.service"}
    assert all(s.detail == s.command for s in plan.steps if s.command)  # shown as run


def test_apply_has_a_handler_for_every_step_a_plan_can_hold():
    from ddops.deploy.apply import STEPS
    plans = [make_plan(DESIRED, f) for f in (facts(), facts(UNIT, ENV, "failed"),
                                             facts(UNIT, ENV, "active", pending={"profile": "cpu-ar"}))]
    assert {s.action for p in plans for s in p.steps} == set(STEPS)


def test_identical_files_on_a_running_service_is_no_change_and_restarts_nothing():
    plan = make_plan(DESIRED, facts(UNIT, ENV, "active"))
    assert plan.noop and not plan.changed and plan.unit_diff == plan.env_diff == ""


def test_identical_files_but_service_down_plans_a_start_without_pushing():
    plan = make_plan(DESIRED, facts(UNIT, ENV, "failed"))
    assert [s.action for s in plan.steps] == ["restart", "gate", "record"]


def test_changed_secret_is_masked_in_the_diff_but_still_a_change():
    plan = make_plan(DESIRED, facts(UNIT, ENV.replace("sk-very-secret", "sk-old"), "active"))
    assert plan.changed and plan.steps[0].action == "backup"
    assert "sk-" not in plan.env_diff and "secret value changed: DDOPS_API_KEY" in plan.env_diff
    assert plan.unit_diff == ""


def test_unit_diff_shows_the_changed_line():
    old = UNIT.replace("30001", "30000")
    plan = make_plan(DESIRED, facts(old, ENV, "active"))
    assert "-ExecStart=" in plan.unit_diff and "+ExecStart=" in plan.unit_diff and "30001" in plan.unit_diff


def test_unfinished_deploy_is_recovered_first():
    plan = make_plan(DESIRED, facts(UNIT, ENV, "active", pending={"profile": "cpu-ar"}))
    assert [s.action for s in plan.steps] == ["recover"]


def test_facts_keep_bytes_and_tell_missing_from_empty():
    answers = {"unit": UNIT.encode(), "env": b"", "pending": None, "now": b"17\n",
               "show": b"ActiveState=active\nSubState=running\nNRestarts=2\nExecMainStartTimestampMonotonic=123\n",
               "history": b"0001-a\n0002-b\n"}
    f = facts_of("llm.service", answers)
    assert f.unit_text == UNIT and f.env_text == "" and f.pending is None
    assert f.state.active == "active" and f.state.restarts == 2 and f.state.started_us == 123
    assert f.history_ids == ("0001-a", "0002-b") and f.host_time == 17


def test_unit_watch_fails_fast_on_crash_or_restart_loop():
    assert check_unit(UnitState(active="activating", sub="start"), 0) is None
    assert check_unit(UnitState(active="active", sub="running"), 0) is None
    assert "failed" in check_unit(UnitState(active="failed", sub="failed"), 0)
    assert "restarting" in check_unit(UnitState(active="activating", sub="auto-restart"), 0)
    assert "restarting" in check_unit(UnitState(active="active", restarts=1), 0)


def test_smoke_needs_several_tokens_of_non_empty_text():
    ok = {"choices": [{"message": {"content": "Paris is"}}], "usage": {"completion_tokens": 5}}
    assert check_smoke(200, ok) is None
    assert check_smoke(200, {**ok, "choices": [{"message": {"content": "  "}}]}) == "empty text"
    assert "1 completion token" in check_smoke(200, {**ok, "usage": {"completion_tokens": 1}})
    assert check_smoke(400, {"error": {"message": "bad model"}}) == "HTTP 400 bad model"


SPEC = GateSpec(base_url="http://h:1", model_path="/m", served_model="tiny", algorithm="DDTREE",
                speculative=True, draft_path="/d", budget=16, uses_tree_budget=True)
INFO = {"model_path": "/m", "speculative_algorithm": "DDTREE", "speculative_draft_model_path": "/d",
        "speculative_ddtree_budget": 16, "internal_states": [{"avg_spec_accept_length": 2.4}]}


def test_server_info_must_show_the_intended_model_method_and_budget():
    assert check_server_info(INFO, SPEC) == []
    assert check_acceptance(INFO, SPEC) is None
    wrong = {**INFO, "speculative_algorithm": None, "speculative_ddtree_budget": 8, "model_path": "/x"}
    problems = " ".join(check_server_info(wrong, SPEC))
    assert "model_path" in problems and "None, expected DDTREE" in problems and "budget is 8" in problems


def test_acceptance_must_exceed_one_only_for_speculative_methods():
    flat = {**INFO, "internal_states": [{"avg_spec_accept_length": 1.0}]}
    assert "not above 1" in check_acceptance(flat, SPEC)
    assert check_acceptance(flat, GateSpec("u", "/m", "t", None, speculative=False)) is None
    assert "no internal_states" in check_acceptance({}, SPEC)


def test_the_probes_verified_rounds_judge_the_draft_whatever_the_controller_ran():
    """A probe that reports enough verified rounds is the verdict without asking /server_info (no
    client at all), passing or failing, with the figure and its rounds in the detail; one lucky
    round, or a probe that reports none (SGLang), leaves it to the server's average."""
    flat = {**INFO, "internal_states": [{"avg_spec_accept_length": 1.0, "spec_accept_rounds": 40}]}
    ok, detail = _acceptance(None, SPEC, {"accept_length": 1.42, "spec_rounds": 18.0})
    assert ok and "1.42" in detail and "18 verified rounds" in detail
    ok, detail = _acceptance(None, SPEC, {"accept_length": 1.0, "spec_rounds": 18.0})
    assert not ok and "not above 1" in detail and "18 verified rounds" in detail
    answers = httpx.MockTransport(lambda request: httpx.Response(200, json=flat))
    with httpx.Client(base_url="http://gate", transport=answers) as client:
        for probe in ({"accept_length": 3.0, "spec_rounds": 1.0}, {"accept_length": 1.0}, {}):
            ok, detail = _acceptance(client, SPEC, probe)
            assert not ok and "not above 1" in detail and "over 40 rounds" in detail


def test_endpoint_from_the_command_line():
    argv = unit_argv(UNIT)
    assert argv[:3] == ["/opt/ddops/venv/bin/python", "-m", "serving"]
    assert endpoint(argv, "10.0.0.5") == "http://10.0.0.5:30001"
    assert endpoint(["x", "--host", "10.1.1.1"], "10.0.0.5") == "http://10.1.1.1:30000"
    assert api_key_of(ENV) == "sk-very-secret"


def test_history_ids_grow():
    assert next_dirname((), 0).startswith("0001-19700101T")
    assert next_dirname(("0001-x", "0009-y"), 0).startswith("0010-")


def test_rollback_default_is_the_newest_passed_entry_unlike_the_current_one():
    from ddops.deploy.history import Entry, Record
    from ddops.deploy.ops import previous_good
    e = lambda n, h, r: Entry("llm.service", f"{n:04d}-x", Record.from_json(json.dumps({"hash": h, "result": r}),  # noqa: E731
                                                                           "llm.service"))
    entries = [e(1, "a", "passed"), e(2, "b", "passed"), e(3, "c", "failed-reverted"), e(4, "b", "passed")]
    assert previous_good(entries, "b").id == "0001"
    assert previous_good(entries, "a").id == "0004"
    assert previous_good(entries[:1], "a") is None


def test_a_second_rollback_goes_further_back_instead_of_undoing_the_first():
    from ddops.deploy.history import Entry, Record
    from ddops.deploy.ops import previous_good
    e = lambda n, h, back=None: Entry("llm.service", f"{n:04d}-x", Record.from_json(  # noqa: E731
        json.dumps({"hash": h, "result": "passed", "returns_to": back}), "llm.service"))
    history = [e(1, "z"), e(2, "a"), e(3, "b"), e(4, "a", back="0002")]   # b rolled back to a
    assert previous_good(history, "a").id == "0001"       # not b again
    assert previous_good(history[:3] + [e(4, "a", back="0002"), e(5, "z", back="0001")], "z") is None
    assert previous_good(history + [e(5, "c")], "c").id == "0004"   # a new deploy: back to what ran before it
