"""--max-total-tokens on a speculative hybrid under the bundled runtime: the runtime refuses it at
start (tests/serving/test_cli.py), so ddops refuses such a change first, from the target's
config.json and the method's capabilities: `ddops fit` and `ddops preflight` exit 2, deploy's
planning check (ddops.deploy.refusals) names it. The flag stays accepted where a pool takes it."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from ddops.cli import app
from ddops.deploy.refusals import refusals
from serving.tools.tiny import write_tiny
from serving.tools.tiny_draft import write_tiny_draft
from tests.deploy.test_refusals import LocalShell, unit
from tests.fit.conftest import CONFIGS
from tests.ops.helpers import write

runner = CliRunner()
CAP = "sglang: {extra_args: [--max-total-tokens, '4096']}\n"


@pytest.fixture(scope="module")
def hybrid_pair(tmp_path_factory):
    """A real tiny Qwen3.5-layout hybrid checkpoint and a DFlash draft made for it."""
    root = tmp_path_factory.mktemp("pair")
    target = write_tiny(root / "hybrid", "qwen3_5")
    return target, write_tiny_draft(target, root / "draft", seed=1)


def profile(folder, name: str, target, draft=None, extra: str = CAP) -> None:
    spec = f"speculative: {{algorithm: ddtree, draft_model_path: {draft}}}\n" if draft else ""
    write(folder, name, f"runtime: bundled\nmodel: {{path: {target}, served_name: m}}\n"
                        f"memory: {{context_length: 1024}}\n{spec}{extra}")


def test_fit_refuses_the_flag_on_a_speculative_hybrid_and_plans_with_it_elsewhere(tmp_path):
    profile(tmp_path, "spec", CONFIGS / "Qwen3.6-27B", CONFIGS / "Qwen3.6-27B-DFlash")
    profile(tmp_path, "plain", CONFIGS / "Qwen3.6-27B")
    profile(tmp_path, "dense", CONFIGS / "Qwen3-8B", CONFIGS / "Qwen3-8B-DFlash-b16")
    refused = runner.invoke(app, ["fit", "spec", "--profiles-dir", str(tmp_path)])
    assert refused.exit_code == 2, refused.output
    assert "sglang.extra_args --max-total-tokens:" in refused.output and "one sequence at a time" in refused.output
    for name in ("plain", "dense"):
        result = runner.invoke(app, ["fit", name, "--profiles-dir", str(tmp_path), "--json"])
        assert result.exit_code == 0, result.output
        assert json.loads(result.stdout)["memory"]["kv_slots"] == 4096


def test_preflight_refuses_it_from_the_targets_config(tmp_path, hybrid_pair):
    target, draft = hybrid_pair
    profile(tmp_path, "capped", target, draft)
    profile(tmp_path, "uncapped", target, draft, extra="")
    result = runner.invoke(app, ["preflight", "capped", "--profiles-dir", str(tmp_path), "--json"])
    assert result.exit_code == 2, result.output
    [problem] = json.loads(result.stdout)["problems"]
    assert problem["key"] == "sglang.extra_args" and problem["reason"].startswith("--max-total-tokens:")
    ok = runner.invoke(app, ["preflight", "uncapped", "--profiles-dir", str(tmp_path), "--json"])
    assert ok.exit_code == 0, ok.output


def test_deploy_planning_refuses_the_unit_that_passes_it(hybrid_pair, tmp_path):
    target, draft = hybrid_pair
    spec = ("--model-path", str(target), "--speculative-algorithm", "DDTREE",
            "--speculative-draft-model-path", str(draft))
    shell = LocalShell()
    [flag] = refusals(shell, unit(*spec, "--max-total-tokens", "4096"))
    assert flag.check == "flag" and flag.reason.startswith("--max-total-tokens:"), flag
    assert refusals(shell, unit(*spec)) == []
    assert refusals(shell, unit("--model-path", str(target), "--max-total-tokens=4096")) == []
