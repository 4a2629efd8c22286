"""SGLang as a real runtime on a lab host: `install-runtime --runtime sglang` (air-gapped, SGLang
0.5.15's CPU engine from the wheelhouse built here), then deploys of the real SGLang serving
SmolLM2 through the same engine as every runtime. The gate passes from SGLang's own answers
(/health, /health_generate, a smoke chat, /server_info); an OpenAI client outside the host gets
the bundled runtime's answer with the key and a 401 without it; the rollout bake reads its real
/metrics; every shipped SGLang profile's command line is accepted by the installed SGLang's own
argument parser; a knowably bad change (DFLASH on a CPU, a missing model, a flag 0.5.15 does not
define) exits 2 while the running unit keeps its bytes and its start; a change that fails at
start is reverted byte for byte and the previous SGLang answers again; SGLang production mirrors
an openai client's chats to a bundled shadow through its request logs."""

from __future__ import annotations

import json
import re
import time

import httpx
import openai
import pytest

from ddops.deploy import ops
from ddops.profile import list_profiles, load_profile
from ddops.render import command_line
from ddops.rollout.fleet import scrape
from tests.conftest import TEST_API_KEY
from tests.deploy.peer_site import SERVED, peer_site, told
from tests.deploy.test_lab_deploy import HERE
from tests.ops.helpers import SHIPPED

pytestmark = [pytest.mark.lab, pytest.mark.smollm]

UNIT, PORT = "stest.service", "30300"
# Chats an openai client sends SGLang production while it mirrors (every fourth streamed).
MIRRORED = [f"{ask} {subject}" for ask in ("Describe", "Name two facts about", "Write one line on", "Define")
            for subject in ("rivers.", "the moon.", "bread.", "a compiler.")]
PROFILES = HERE / "profiles"
VERSION = "0.5.15"


@pytest.fixture(scope="module")
def ssite(deploy_lab, cache_dir):
    for site, report in peer_site(deploy_lab, cache_dir, "sglang", UNIT, PORT):
        assert (report["version"], report["build"]) == (VERSION, "cpu"), report
        assert report["flags"] > 400, report          # its own parser built, every flag it defines
        yield site


def test_install_again_pushes_nothing_and_leaves_no_wheels(ssite):
    report = ssite.install("sglang")
    assert report["wheels_installed"] == [] and report["bytes_pushed"] == 0
    assert not ssite.remote.exists("/opt/sglang/wheelhouse")


def test_a_cpu_host_takes_only_the_release_whose_cpu_engine_runs(ssite):
    refused = ssite.ddops("install-runtime", "--runtime", "sglang", "--host", ssite.name, "--version", "0.5.23")
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert "sgl-kernel" in refused.stdout + refused.stderr


def test_bundled_production_serves_smollm2(ssite):
    code, out = ssite.deploy_json("cpu-smollm2-ar")
    assert (code, out["result"]) == (0, "deployed"), told(out)
    ssite.bundled_answer = ssite.ask().json()["choices"][0]["message"]["content"]
    assert "Paris" in ssite.bundled_answer


def test_sglang_replaces_bundled_passes_the_gate_and_answers_an_openai_client(ssite):
    code, out = ssite.deploy_json("cpu-smollm2-sglang")
    assert (code, out["result"]) == (0, "deployed"), told(out)
    checks = {c["name"]: c for c in out["gate"]["checks"]}
    assert list(checks) == ["health", "generate", "smoke", "server_info"], checks   # SGLang has all four
    assert "/var/lib/ddops/models/smollm2-135m-instruct with plain decoding" in checks["server_info"]["detail"]
    client = openai.OpenAI(base_url=f"http://{ssite.host.address}:{PORT}/v1", api_key=TEST_API_KEY,
                           http_client=httpx.Client(trust_env=False), timeout=120)
    answer = client.chat.completions.create(model=SERVED, temperature=0, max_tokens=12,
                                            messages=[{"role": "user", "content": "What is the capital of France?"}])
    assert answer.choices[0].message.content == ssite.bundled_answer     # T=0, same fp32 checkpoint
    assert ssite.ask(key=None).status_code == 401
    unit = ssite.unit_bytes().decode()
    assert TEST_API_KEY not in unit and f"DDOPS_API_KEY={TEST_API_KEY}" in ssite.env_bytes().decode()
    assert "Environment=SGLANG_USE_CPU_ENGINE=1" in unit and "--attention-backend torch_native" in unit


def test_the_sandbox_scores_under_5(ssite):
    line = ssite.remote.run(f"systemd-analyze security {UNIT} --no-pager | tail -1").stdout
    score = float(line.split("level for")[1].split(":")[1].split()[0])
    assert score < 5.0, line


def test_the_bake_reads_sglang_real_metrics(ssite):
    before = scrape.read(f"http://{ssite.host.address}:{PORT}", TEST_API_KEY)
    for content in ("Name a colour.", "Count to three."):
        assert ssite.ask(content=content, max_tokens=8).status_code == 200
    window = scrape.read(f"http://{ssite.host.address}:{PORT}", TEST_API_KEY).since(before)
    figures = window.summary()
    assert window.runtime == "sglang" and figures["requests"] == 2 and figures["errors"] == 0, figures
    assert 2 <= window.generated <= 16 and figures["e2e_p50"] > 0 and figures["ttft_p50"] > 0, figures


def test_ddops_keeps_none_of_the_secrets_sglang_server_info_returns(ssite):
    raw = httpx.get(f"http://{ssite.host.address}:{PORT}/server_info", trust_env=False, timeout=30,
                    headers={"Authorization": f"Bearer {TEST_API_KEY}"}).json()
    assert raw["api_key"] == TEST_API_KEY          # SGLang 0.5.15 hands its key back
    kept = ops.read_unit(ssite.remote, UNIT).server_info    # what status and a switch's report hold
    assert kept["model_path"] == raw["model_path"] and kept["max_total_num_tokens"] == 16384
    assert TEST_API_KEY not in json.dumps(kept) and "admin_api_key" not in kept


@pytest.mark.parametrize("name", [n for n in list_profiles(SHIPPED)
                                  if load_profile(n, SHIPPED).sglang_version == VERSION])
def test_shipped_sglang_profiles_parse_with_the_installed_sglang(ssite, name):
    """The rendered command line, through SGLang's own argparse and ServerArgs (no model loaded);
    its --config file holds the key as ExecStartPre writes it."""
    argv = command_line(load_profile(name, SHIPPED))[3:]
    at = argv.index("--config") + 1
    ssite.remote.write("/tmp/parse-key.yaml", json.dumps({"api-key": "k"}).encode())
    argv[at] = "/tmp/parse-key.yaml"
    check = ("import sys; from sglang.srt.server_args import prepare_server_args; "
             "a = prepare_server_args(sys.argv[1:]); print(a.device, a.attention_backend)")
    quoted = " ".join(json.dumps(word) for word in argv)
    done = ssite.remote.run(f"cd /tmp && HOME=/tmp /opt/sglang/venv/bin/python -c {json.dumps(check)} {quoted}",
                            check=False, timeout=120)
    assert done.ok, done.stderr[-2000:]
    assert done.stdout.split()[-2:] == ["cpu", "torch_native"]


@pytest.mark.parametrize("profile, check, words", [
    ("sglang-cpu-dflash.yaml", None, "cannot run a speculative method on device cpu"),
    ("sglang-missing-model.yaml", "model-missing", "not-pushed/config.json"),
    ("sglang-unknown-flag.yaml", "flag", "--speculative-ddtree-budget-typo is not accepted by the installed"),
    ("sglang-no-room.yaml", "fit", "Loaded weights leave no GPU memory for the KV cache"),
])
def test_a_knowably_bad_sglang_change_exits_2_with_zero_restarts(ssite, profile, check, words):
    before_bytes, before = ssite.unit_bytes(), ssite.started()
    code, out = ssite.deploy_json(str(PROFILES / profile))
    assert code == 2, told(out)
    if check is None:     # refused while reading the profile: no plan, no host read
        assert words in out["error"], out
    else:
        assert out["result"] == "refused", told(out)
        found = [(r["check"], r["reason"]) for r in out["plan"]["refusals"]]
        assert any(c == check and words in reason for c, reason in found), found
    assert ssite.unit_bytes() == before_bytes
    assert ssite.started() == before and before[2] == "active"


def test_a_port_another_process_holds_is_refused_before_any_restart(ssite):
    """SGLang would die binding it (journals/sglang/port-in-use.log): known from the host first."""
    ssite.remote.run("systemd-run --unit=squat python3 -m http.server 30301 --bind 0.0.0.0 && "
                     "for i in $(seq 50); do ss -Hltn 'sport = :30301' | grep -q . && break; sleep 0.1; done")
    try:
        before_bytes, before = ssite.unit_bytes(), ssite.started()
        done = ssite.ddops("deploy", "cpu-smollm2-sglang", "--host", ssite.name, "--unit", UNIT, "--port", "30301",
                           "--yes", "--json")
        out = json.loads(done.stdout)
        assert (done.returncode, out["result"]) == (2, "refused"), told(out)
        reasons = [r["reason"] for r in out["plan"]["refusals"] if r["check"] == "port"]
        assert reasons and "port 30301 is held by python3" in reasons[0] and "unit squat.service" in reasons[0]
        assert ssite.unit_bytes() == before_bytes and ssite.started() == before
    finally:
        ssite.remote.run("systemctl stop squat", check=False)


def test_a_sglang_change_that_fails_at_start_is_reverted_byte_for_byte(ssite):
    before_unit, before_env = ssite.unit_bytes(), ssite.env_bytes()
    code, out = ssite.deploy_json(str(PROFILES / "sglang-bad-tokenizer.yaml"))
    assert (code, out["result"]) == (1, "reverted"), told(out)
    assert out["gate"]["checks"][0]["name"] == "health" and not out["gate"]["checks"][0]["ok"]
    causes = [d["cause"] for d in out["diagnosis"]]
    assert causes[:1] == ["model-path-missing"] and "no-such-tokenizer" in out["diagnosis"][0]["evidence"], \
        out["diagnosis"]
    assert ssite.unit_bytes() == before_unit and ssite.env_bytes() == before_env
    assert ssite.ask().json()["choices"][0]["message"]["content"] == ssite.bundled_answer   # SGLang again


def test_rollback_moves_the_host_back_to_the_bundled_runtime(ssite):
    entries = json.loads(ssite.ddops("history", "--host", ssite.name, "--unit", UNIT, "--json").stdout)["entries"]
    first = entries[0]
    assert (first["profile"], first["result"]) == ("cpu-smollm2-ar", "passed"), entries
    back = ssite.ddops("rollback", "--host", ssite.name, "--unit", UNIT, "--to", first["id"], "--yes", "--json")
    assert back.returncode == 0, back.stdout + back.stderr
    assert b"-m serving" in ssite.unit_bytes() and b"SGLANG_USE_CPU_ENGINE" not in ssite.unit_bytes()
    assert ssite.ask().json()["choices"][0]["message"]["content"] == ssite.bundled_answer


def test_a_rollout_moves_the_host_from_the_bundled_runtime_to_sglang(ssite, tmp_path):
    """A one-host plan (the canary): SGLang replaces the bundled runtime, the gate passes and the
    bake judges SGLang's own /metrics; history records the move."""
    plan = tmp_path / "to-sglang.yaml"
    plan.write_text(json.dumps({"profile": str(PROFILES / "sglang-mirror.yaml"), "hosts": [ssite.name],
                                "canary": 1, "bake_s": 5}))
    done = ssite.ddops("rollout", str(plan), "--yes", "--json")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert json.loads(done.stdout)["status"] == "succeeded", done.stdout[-3000:]
    assert b"SGLANG_USE_CPU_ENGINE=1" in ssite.unit_bytes() and b"-m serving" not in ssite.unit_bytes()
    assert ssite.ask().json()["choices"][0]["message"]["content"] == ssite.bundled_answer
    last = json.loads(ssite.ddops("history", "--host", ssite.name, "--unit", UNIT, "--json").stdout)["entries"][-1]
    assert (last["profile"], last["result"]) == ("sglang-mirror", "passed"), last


def test_the_pool_and_fraction_sglang_picks_are_the_ones_fit_predicts(ssite):
    """cpu-smollm2-sglang leaves the fraction to SGLang and caps the pool: both are fixed by the
    host's size, so `ddops fit --host` must name them exactly. An uncapped pool follows the host's
    free RAM, which other work moves while SGLang starts (by 13% under `make test`): measured on
    a quiet host by `python -m ddops.lab.bench_sglang_pool` (docs/sglang.md "Memory"). Read from
    the start the rollout above made (its profile adds only request logging)."""
    fit = json.loads(ssite.ddops("fit", "cpu-smollm2-sglang", "--host", ssite.name, "--json").stdout)
    journal = ssite.remote.run(f"journalctl -u {UNIT} -o cat --no-pager -n 400").stdout
    reported = int(re.findall(r"max_total_num_tokens=(\d+)", journal)[-1])
    fraction = float(re.findall(r"mem_fraction_static=([0-9.]+)", journal)[-1])
    assert (fit["kv_pool_tokens"], fit["mem_fraction_static"]) == (reported, fraction), fit


def test_sglang_production_mirrors_its_traffic_to_a_bundled_shadow_through_its_request_logs(ssite):
    """SGLang as production, opted in (service.mirror: its JSON request logs at level 3); `shadow
    start --mirror` puts the relay beside it; an openai client's chats (streamed ones too) reach
    the bundled shadow as records and are regenerated and compared token for token."""
    assert b"--log-requests-format json" in ssite.unit_bytes()     # the rollout above deployed it
    shadow = ssite.ddops("shadow", "start", "cpu-smollm2-ar", "--host", ssite.name, "--production-unit", UNIT,
                         "--port", "30310", "--mirror", "--yes", "--json")
    assert shadow.returncode == 0, shadow.stdout[-3000:] + shadow.stderr[-2000:]
    try:
        client = openai.OpenAI(base_url=f"http://{ssite.host.address}:{PORT}/v1", api_key=TEST_API_KEY,
                               http_client=httpx.Client(trust_env=False), timeout=120)
        for i, prompt in enumerate(MIRRORED):
            asked = dict(model=SERVED, temperature=0, max_tokens=16, messages=[{"role": "user", "content": prompt}])
            if i % 4 == 3:
                assert "".join(c.choices[0].delta.content or "" for c in
                               client.chat.completions.create(stream=True, **asked) if c.choices)
            else:
                assert client.chat.completions.create(**asked).choices[0].message.content
        stats = f"http://{ssite.host.address}:30310/mirror/stats"
        deadline = time.monotonic() + 120     # the shadow compares after production answered
        while httpx.get(stats, headers={"Authorization": f"Bearer {TEST_API_KEY}"}, trust_env=False,
                        timeout=30).json()["compared"] < 16 and time.monotonic() < deadline:
            time.sleep(0.5)
        compared = ssite.ddops("shadow", "compare", "--mirrored", "--json")
        doc = json.loads(compared.stdout)
        comparison = doc["comparison"]
        mirrored = comparison["mirrored"]
        assert compared.returncode == 0, json.dumps(comparison)[:3000]    # the default policy: 16, equality 1.0
        assert (mirrored["requests"], mirrored["by_ids"]) == (16, 16), mirrored
        assert mirrored["tap"]["relay"] == "sglang_log" and mirrored["tap"]["streamed"] == 4, mirrored
        assert comparison["token_equality"] >= 0.95, comparison["deterministic"]
    finally:
        aborted = ssite.ddops("shadow", "abort", "--yes")
        assert aborted.returncode == 0, aborted.stdout + aborted.stderr
    assert ssite.remote.run(f"systemctl is-active {ssite.stem}-mirror-relay.service", check=False).stdout.strip() \
        != "active"
