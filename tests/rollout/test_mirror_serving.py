"""Mirroring between real runtime processes on loopback: production (plain, --enable-mirror)
copies its finished requests to a DDTree shadow of the same tiny model, which regenerates and
compares token by token (docs/mirror.md)."""

import json
import time

import httpx
import pytest
import yaml
from typer.testing import CliRunner

from ddops.cli import app

from tests.rollout import lab_models
from tests.rollout.serving_pair import Server

KEY = "mirror-test-key"
AUTH = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture(scope="module")
def pair(tmp_path_factory, cache_dir):
    """The rollout lab's cached models: tiny-llama and its distilled draft (real acceptance)."""
    root = tmp_path_factory.mktemp("mirror")
    models = lab_models.build(cache_dir)
    started = {
        "production": Server(models["tiny-llama"], root / "production.log", "--enable-mirror", api_key=KEY),
        "shadow": Server(models["tiny-llama"], root / "shadow.log", "--speculative-algorithm", "DDTREE",
                         "--speculative-draft-model-path", str(models["tiny-llama-dflash"]), api_key=KEY),
    }
    try:
        yield {name: s.wait_ready() for name, s in started.items()}
    finally:
        for s in started.values():
            s.stop()


def chat(url: str, text: str, **extra) -> httpx.Response:
    body = {"model": "tiny", "messages": [{"role": "user", "content": text}], "max_tokens": 12, **extra}
    return httpx.post(url + "/v1/chat/completions", json=body, headers=AUTH, timeout=60)


def mirror_counters(url: str) -> tuple[float, float]:
    """The shadow's /metrics counters of mirrored T=0 requests: (compared, equal)."""
    page = httpx.get(url + "/metrics", headers=AUTH, timeout=5).text
    found = {line.split()[0]: float(line.split()[1]) for line in page.splitlines() if line.startswith("serving_mirror_")}
    return found["serving_mirror_deterministic_total"], found["serving_mirror_equal_total"]


def settled(url: str, count: int, timeout_s: float = 60.0) -> dict:
    """The shadow's stats once `count` records are compared or failed (polling, not timing)."""
    deadline = time.monotonic() + timeout_s
    while True:
        stats = httpx.get(url + "/mirror/stats", headers=AUTH, timeout=5).json()
        if stats["compared"] + stats["failed"] + stats["dropped"] >= count or time.monotonic() > deadline:
            return stats
        time.sleep(0.1)


def test_mirrored_greedy_requests_are_equal_token_by_token(pair):
    prod, shadow = pair["production"].url, pair["shadow"].url
    before = httpx.get(shadow + "/mirror/stats", headers=AUTH).json()["compared"]
    tap = httpx.put(prod + "/mirror", json={"url": shadow, "api_key": KEY, "sample": 1.0}, headers=AUTH)
    assert tap.status_code == 200 and tap.json()["target"] == shadow
    texts = [f"Tell me about the number {i}. My key is sk-abcdefghijklmnop" for i in range(6)]
    for text in texts:
        assert chat(prod, text, temperature=0).status_code == 200
    assert chat(prod, "Sample freely", temperature=1.0).status_code == 200
    stats = settled(shadow, before + 7)
    det = stats["deterministic"]
    assert det["requests"] >= 6 and det["equal"] == det["requests"] and det["token_equality"] == 1.0
    assert det["compared_tokens"] > 0
    assert stats["distribution"]["shadow"]["requests"] >= 1          # the T=1 request: by distribution
    # the draft accepts on this traffic (from its trials, whatever rounds the adaptive shadow ran)
    assert stats["shadow"]["accept_length"] > 1.0 and stats["shadow"]["trials"] > 0
    assert stats["shadow"]["ttft_p50_s"] > 0
    assert stats["samples"] and all("sk-abcdefghijklmnop" not in s["prompt"] for s in stats["samples"])
    assert any("[redacted]" in s["prompt"] for s in stats["samples"])
    counts = httpx.get(prod + "/mirror", headers=AUTH).json()
    assert counts["offered"] == 7 and counts["sent"] == 7


def test_a_stopped_shadow_costs_production_no_errors(pair):
    prod = pair["production"].url
    nothing = "http://127.0.0.1:9"            # discard port: the shadow is down
    httpx.put(prod + "/mirror", json={"url": nothing, "api_key": KEY}, headers=AUTH).raise_for_status()
    answers = [chat(prod, f"Still serving {i}?", temperature=0) for i in range(5)]
    assert [a.status_code for a in answers] == [200] * 5
    counts = httpx.get(prod + "/mirror", headers=AUTH).json()
    assert counts["offered"] == 5 and counts["sent"] == 0
    assert counts["failed"] + counts["dropped_backoff"] + counts["queued"] == 5
    httpx.delete(prod + "/mirror", headers=AUTH).raise_for_status()


def test_mirroring_is_opt_in_and_records_are_checked(pair):
    shadow = pair["shadow"].url                 # started without --enable-mirror
    refused = httpx.put(shadow + "/mirror", json={"url": shadow}, headers=AUTH)
    assert refused.status_code == 403 and "--enable-mirror" in refused.json()["error"]["message"]
    bad = httpx.post(shadow + "/mirror/records", json={"prompt_ids": "x"}, headers=AUTH)
    assert bad.status_code == 400
    assert httpx.get(shadow + "/mirror/stats").status_code == 401       # keyed like the API
    assert httpx.get(shadow + "/health").status_code == 200             # and still serving


def test_cli_compare_mirrored_judges_by_the_profile_requirement(pair, tmp_path, monkeypatch):
    """`shadow compare --mirrored --json` after the greedy test's traffic: the profile's
    rollout.analysis.mirror requirement judges it, the result and the HTML report are saved."""
    monkeypatch.setenv("DDOPS_STATE", str(tmp_path / "state"))
    monkeypatch.setenv("MIRROR_TEST_KEY", KEY)
    prod, shadow = pair["production"].url, pair["shadow"].url
    httpx.put(prod + "/mirror", json={"url": shadow, "api_key": KEY}, headers=AUTH).raise_for_status()
    before = settled(shadow, 0)          # the earlier tests' records: this test waits for its own two
    for i in range(2):
        assert chat(prod, f"One more, {i}", temperature=0).status_code == 200
    settled(shadow, before["compared"] + before["failed"] + before["dropped"] + 2)

    def compare(requirement: dict) -> tuple[int, dict]:
        profile = tmp_path / "mirrored.yaml"
        profile.write_text(yaml.safe_dump({"extends": "cpu-ddtree", "service": {"secrets": {
            "api_key_env": "MIRROR_TEST_KEY"}}, "rollout": {"analysis": {
                "checks": [{"metric": "error_ratio", "max": 0.01}], "mirror": requirement}}}))
        result = CliRunner().invoke(app, ["shadow", "compare", "--mirrored", "--json", "--profile",
                                          str(profile), "--production-url", prod, "--shadow-url", shadow,
                                          "--results-dir", str(tmp_path / "results")])
        return result.exit_code, json.loads(result.stdout)

    code, doc = compare({"min_requests": 2, "min_token_equality": 1.0, "min_accept_length": 1.0})
    comparison = doc["comparison"]
    assert code == 0 and doc["verdict"]["passed"], doc["verdict"]
    assert comparison["mirrored"]["requests"] >= 2 and comparison["token_equality"] == 1.0
    assert comparison["shadow"]["accept_length"] >= 1.0
    assert "Mirrored shadow comparison" in open(doc["report_file"]).read()
    code, doc = compare({"min_requests": 100000})
    assert code == 1 and doc["verdict"]["reasons"][0].startswith(f"{comparison['mirrored']['requests']} mirrored")


def test_rollout_requires_the_mirroring_shadow_before_its_canary(pair, tmp_path, monkeypatch):
    """analysis.mirror is judged on the recorded shadow before any host is touched: unmet, the
    rollout exits 1 and the (unreachable) host is never contacted; no shadow recorded: exit 2."""
    from ddops.rollout.records import ShadowRecord, save_shadow
    from tests.server_process import free_port
    monkeypatch.setenv("DDOPS_STATE", str(tmp_path / "state"))
    monkeypatch.setenv("MIRROR_TEST_KEY", KEY)
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(yaml.safe_dump({"hosts": {"h1": {"address": "127.0.0.1", "ssh_port": free_port()}}}))
    profile = tmp_path / "gated.yaml"
    profile.write_text(yaml.safe_dump({"extends": "cpu-ddtree", "service": {"secrets": {
        "api_key_env": "MIRROR_TEST_KEY"}}, "rollout": {"bake_s": 1, "analysis": {
            "checks": [{"metric": "error_ratio", "max": 0.01}], "mirror": {"min_requests": 100000}}}}))
    plan = tmp_path / "plan.yaml"
    plan.write_text(yaml.safe_dump({"profile": str(profile), "hosts": ["h1"], "canary": 1}))
    args = ["rollout", str(plan), "--inventory", str(inventory), "--yes", "--json"]
    none = CliRunner().invoke(app, args)
    assert none.exit_code == 2 and "no shadow is recorded" in json.loads(none.stdout)["error"]
    save_shadow(ShadowRecord(profile=str(profile), host="h1", unit="llm-shadow.service", port=0,
                             url=pair["shadow"].url, production_host="h1", production_unit="llm.service",
                             production_url=pair["production"].url, production_profile=None, started=0.0))
    unmet = CliRunner().invoke(app, args)
    doc = json.loads(unmet.stdout)
    assert unmet.exit_code == 1 and "analysis.mirror" in doc["error"] and "mirrored requests" in doc["error"]


def test_start_plans_from_what_production_answers(pair, tmp_path):
    """`shadow start --mirror` asks production's server whether it allows mirroring (exit 2
    before the shadow is deployed otherwise) and refuses a shadow runtime without the sink."""
    from ddops.profile import load_profile
    from ddops.exits import BadInput
    from ddops.rollout.shadow.compare import Endpoint
    from ddops.rollout.shadow.mirrored import refuse_unless_mirrorable
    from ddops.inventory import Host
    from ddops.render import render
    candidate, sglang = load_profile("cpu-ddtree"), load_profile("a6000-base")
    host, unit = Host(name="h1", address="127.0.0.1"), render(load_profile("cpu-ar")).unit_text

    def plan(profile, url, key=KEY):
        return refuse_unless_mirrorable(profile, host, unit, Endpoint("production", url, api_key=key))
    assert plan(candidate, pair["production"].url).kind == "tap"
    with pytest.raises(BadInput, match="does not opt in"):      # started without --enable-mirror
        plan(candidate, pair["shadow"].url)
    with pytest.raises(BadInput, match="refused the profile's API key"):
        plan(candidate, pair["production"].url, "wrong")
    with pytest.raises(BadInput, match="no mirror sink"):
        plan(sglang, pair["production"].url)


def test_a_record_the_shadow_refuses_is_counted_not_backed_off(pair):
    prod, shadow = pair["production"].url, pair["shadow"].url
    httpx.put(prod + "/mirror", json={"url": shadow, "api_key": "wrong"}, headers=AUTH).raise_for_status()
    for i in range(3):
        assert chat(prod, f"Refused copy {i}", temperature=0).status_code == 200
    deadline = time.monotonic() + 30
    while (counts := httpx.get(prod + "/mirror", headers=AUTH).json())["rejected"] < 3 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert counts["rejected"] == 3 and counts["dropped_backoff"] == counts["failed"] == 0
    httpx.delete(prod + "/mirror", headers=AUTH).raise_for_status()


def text_record(prompt: list[int], text, **extra) -> dict:
    return {"prompt_ids": prompt, "sampling": {"temperature": 0.0, "top_p": 1.0, "top_k": -1, "seed": None},
            "max_new_tokens": 12, "stop_strings": [], "stop_ids": [], "answer_text": text, **extra}


def test_a_record_with_only_production_text_is_compared_by_text_apart_from_ids(pair):
    """A relay's record of a streamed chat (docs/mirror.md): production's answer as text. The
    shadow regenerates from the prompt ids and compares the text it would send a client."""
    prod, shadow = pair["production"].url, pair["shadow"].url
    prompt = [1, 15, 27, 40, 52, 63]
    answer = httpx.post(prod + "/v1/completions", headers=AUTH, timeout=60, json={
        "prompt": prompt, "max_tokens": 12, "temperature": 0, "ignore_eos": True}).json()["choices"][0]["text"]
    assert answer
    before = httpx.get(shadow + "/mirror/stats", headers=AUTH).json()
    for text in (answer, answer[:3] + "\u2603" + answer[3:]):       # production's own, and one that differs
        sent = httpx.post(shadow + "/mirror/records", json=text_record(prompt, text), headers=AUTH)
        assert sent.status_code == 202, sent.text
    stats = settled(shadow, before["compared"] + before["failed"] + before["dropped"] + 2)
    by_text, was = stats["text"], before["text"]
    assert (by_text["requests"] - was["requests"], by_text["equal"] - was["equal"]) == (2, 1)
    matched, compared = by_text["matched_chars"] - was["matched_chars"], by_text["compared_chars"] - was["compared_chars"]
    assert (matched, compared) == (len(answer) + 3, 2 * len(answer) + 1)
    assert by_text["text_equality"] < 1.0
    assert stats["deterministic"] == before["deterministic"]          # token equality keeps its meaning
    # what the operator's Prometheus reads (DdopsShadowDiverges' counters): the same comparisons
    assert mirror_counters(shadow) == (stats["deterministic"]["requests"] + by_text["requests"],
                                       stats["deterministic"]["equal"] + by_text["equal"])
    # exactly one of answer_ids / answer_text, each well formed: a 400 naming the field
    both = text_record(prompt, answer, answer_ids=[5])
    neither = {k: v for k, v in text_record(prompt, answer).items() if k != "answer_text"}
    for record, field in ((both, "answer_text"), (neither, "answer_ids"), (text_record(prompt, [5]), "answer_text"),
                          (text_record(prompt, answer, finish_reason=7), "finish_reason")):
        refused = httpx.post(shadow + "/mirror/records", json=record, headers=AUTH)
        assert refused.status_code == 400 and refused.json()["error"]["param"] == field, refused.text
    assert httpx.get(shadow + "/health").status_code == 200
