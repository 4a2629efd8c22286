"""Shadow comparison against real runtime processes: plain vs DDTree of the same tiny model
(lossless: identical tokens at temperature 0) and plain vs a different model (caught)."""

import json

import pytest
from typer.testing import CliRunner

from ddops.cli import app
from ddops.profile.schema import RolloutSpec
from ddops.rollout.shadow.compare import Endpoint, Settings, compare
from ddops.rollout.shadow.prompts import load_prompts
from ddops.rollout.shadow.judge import judge
from tests.rollout.serving_pair import Server, make_checkpoints

SETTINGS = Settings(count=4, concurrency=2, max_tokens=16)
# CPU tiny models: equality is the point here; speed bounds are loose because two runtimes
# share two cores with other tests. The lab tests use the profile's own policy.
POLICY = RolloutSpec(min_token_equality=1.0, max_p95_latency_regression=20.0,
                     min_tokens_per_s_ratio=0.01)


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    root = tmp_path_factory.mktemp("pair")
    paths = make_checkpoints(root)
    started = {
        "plain": Server(paths["target"], root / "plain.log"),
        "ddtree": Server(paths["target"], root / "ddtree.log", "--speculative-algorithm", "DDTREE",
                         "--speculative-draft-model-path", str(paths["draft"])),
        "other": Server(paths["other"], root / "other.log"),
    }
    try:
        yield {name: s.wait_ready() for name, s in started.items()}
    finally:
        for s in started.values():
            s.stop()


def endpoint(name, server):
    return Endpoint(name, server.url)


def test_ddtree_shadow_matches_plain_production_exactly(servers):
    result = compare(endpoint("production", servers["plain"]), endpoint("shadow", servers["ddtree"]),
                     load_prompts(), SETTINGS)
    assert result.token_equality == 1.0 and result.prompts_equal == 4
    assert all(s.text for s in result.samples["shadow"])  # something was generated
    assert result.production.errors == result.shadow.errors == 0
    assert result.production.completion_tokens == result.shadow.completion_tokens > 0
    assert result.production.accept_length == 1.0  # plain decoding reports 1.0
    assert result.shadow.accept_length is not None and result.shadow.accept_length >= 1.0
    assert result.shadow.ttft_p95_s is not None and result.shadow.latency_p95_s >= result.shadow.ttft_p50_s
    verdict = judge(result, POLICY)
    assert verdict.passed, verdict.reasons


def test_different_model_is_caught(servers):
    result = compare(endpoint("production", servers["plain"]), endpoint("shadow", servers["other"]),
                     load_prompts(), SETTINGS)
    assert result.token_equality < 1.0 and result.prompts_equal < 4
    verdict = judge(result, POLICY)
    assert not verdict.passed
    assert any(r.startswith("token equality") for r in verdict.reasons)


def test_cli_compare_saves_results_and_exits_by_verdict(servers, tmp_path, monkeypatch):
    monkeypatch.setenv("DDOPS_STATE", str(tmp_path / "state"))
    runner = CliRunner()
    args = ["shadow", "compare", "--count", "2", "--max-tokens", "8", "--json",
            "--production-url", servers["plain"].url, "--results-dir", str(tmp_path / "results")]
    wrong = runner.invoke(app, args + ["--shadow-url", servers["other"].url])
    doc = json.loads(wrong.stdout)
    assert wrong.exit_code == 1 and doc["exit_code"] == 1 and doc["verdict"]["passed"] is False
    saved = json.loads(open(doc["results_file"]).read())
    assert saved["comparison"]["token_equality"] == doc["comparison"]["token_equality"] < 1.0
    assert len(saved["comparison"]["per_prompt"]) == 2
    report = open(doc["report_file"]).read()  # the HTML report beside the saved results
    assert doc["report_file"] == doc["results_file"].removesuffix(".json") + ".html"
    assert "<h1>Shadow comparison</h1>" in report and report.count("<svg") == 2


def test_unreachable_shadow_fails_the_verdict_not_the_tool(servers):
    dead = Endpoint("shadow", "http://127.0.0.1:9")  # discard port: nothing listens
    result = compare(endpoint("production", servers["plain"]), dead, load_prompts(),
                     Settings(count=2, concurrency=1, max_tokens=4, timeout_s=5))
    verdict = judge(result, POLICY)
    assert result.shadow.errors == 2 and not verdict.passed
