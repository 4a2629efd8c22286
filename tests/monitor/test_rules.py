"""The rendered rules against Debian's promtool: they load, and `promtool test rules` checks every
recording figure for all three runtimes and every alert, firing and quiet."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from ddops.monitor import render, rules

HERE = Path(__file__).parent
PROMTOOL = shutil.which("promtool")
pytestmark = pytest.mark.skipif(PROMTOOL is None, reason="no promtool (apt package prometheus: make apt)")


@pytest.fixture(scope="module")
def rendered(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("monitor")
    render.write(out, [])
    return out


def promtool(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([PROMTOOL, *args], capture_output=True, text=True, timeout=120)


def test_the_rules_load_and_pass_promtools_lint(rendered):
    done = promtool("check", "rules", str(rendered / "rules" / "ddops.yml"))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS: 16 rules found" in done.stdout


def test_promtool_tests_every_alert_and_one_accepted_length_for_every_runtime(rendered, tmp_path):
    spec = yaml.safe_load((HERE / "rules_test.yml").read_text())
    spec["rule_files"] = [str(rendered / "rules" / "ddops.yml")]
    tested = {case["alertname"] for t in spec["tests"] for case in t.get("alert_rule_test", [])}
    assert tested == {a["alert"] for a in rules.alerts()}
    case = tmp_path / "rules_test.yml"
    case.write_text(yaml.safe_dump(spec, sort_keys=False))
    done = promtool("test", "rules", str(case))
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_figure_a_runtime_cannot_tell_has_no_rule():
    """Each figure's rule in the file has a part for every runtime that tells it, and no other."""
    told = {r.record: {rt for rt in rules.SERIES if f'runtime="{rt}"' in r.expr} for r in rules.joined()}
    untold = {rt: sorted(record for record, by in told.items() if rt not in by) for rt in rules.SERIES}
    mirrored = ["ddops:mirror_compared:increase15m", "ddops:mirror_equality:ratio15m"]   # only ours mirror
    assert untold == {"bundled": [], "sglang": ["ddops:cancelled_ratio:rate5m", *mirrored],
                      "vllm": ["ddops:cancelled_ratio:rate5m", *mirrored]}


def test_a_profile_s_own_bounds_become_its_alerts_and_replace_the_generic_ttft_bound(tmp_path):
    """cpu-ddtree declares a 5 s TTFT SLO and a break-even of 1.2 tokens a round: its service at
    1.02 a round and a 29.8 s p99 raises both, and the generic 10 s bound no longer covers it."""
    from ddops.profile.schema import MonitoringSpec
    out = tmp_path / "monitor"
    render.write(out, [], profiles={"cpu-ddtree": MonitoringSpec(ttft_p99_slo_s=5, break_even_accept_length=1.2)})
    assert promtool("check", "rules", str(out / "rules" / "ddops.yml")).returncode == 0
    spec = yaml.safe_load((HERE / "rules_test.yml").read_text())
    spec["rule_files"] = [str(out / "rules" / "ddops.yml")]
    base = spec["tests"][0]           # lab-1 runs cpu-ddtree: 1.02 tokens a round, TTFT p99 29.8 s
    labels = {"severity": "warning", "host": "lab-1", "unit": "llm.service", "profile": "cpu-ddtree",
              "runtime": "bundled", "method": "ddtree", "speculative": "true", "role": "production"}
    base["alert_rule_test"] = [
        {"alertname": "DdopsBelowBreakEven", "eval_time": "20m", "exp_alerts": [{"exp_labels": labels, "exp_annotations": {
            "summary": "llm.service on lab-1: its draft accepts 1.02 tokens a round, under cpu-ddtree's break-even 1.2: "
                       "plain decoding would be faster here"}}]},
        {"alertname": "DdopsTtftOverSlo", "eval_time": "20m", "exp_alerts": [{"exp_labels": labels, "exp_annotations": {
            "summary": "llm.service on lab-1: time to first token p99 29.8s, over cpu-ddtree's SLO of 5 s"}}]},
        {"alertname": "DdopsSlowFirstToken", "eval_time": "20m", "exp_alerts": []}]
    spec["tests"] = [base]
    case = tmp_path / "own_test.yml"
    case.write_text(yaml.safe_dump(spec, sort_keys=False))
    done = promtool("test", "rules", str(case))
    assert done.returncode == 0, done.stdout + done.stderr
