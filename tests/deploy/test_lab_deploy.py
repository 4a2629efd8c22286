"""Deploy, gate, revert, lock, history, rollback and recovery on a real lab host (systemd in an
nspawn container, real sshd, the bundled runtime with tiny real models).

The tests run in file order and share one host and one unit, like an operator's day:
fresh deploy -> no-op re-deploy -> DDTree deploy -> broken deploys reverted -> preflight ->
lock contention -> rollback -> killed deploy recovered -> `@@` in every recorded field -> secrets
-> rollback to the `@@` entry."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import yaml

from ddops.deploy.facts import unit_state
from ddops.deploy.lock import Holder, HostLock
from ddops.remote import CommandFailed, connect
from tests.conftest import TEST_API_KEY
from tests.deploy.models import tiny_pair, wide_draft

pytestmark = pytest.mark.lab

HERE = Path(__file__).parent
MISMATCH = str(HERE / "profiles" / "cpu-ddtree-mismatch.yaml")
WITH_KEY = str(HERE / "profiles" / "cpu-ar-key.yaml")
LOOPBACK = str(HERE / "profiles" / "cpu-ar-loopback.yaml")
MISSING_MODEL = str(HERE / "profiles" / "cpu-ar-missing-model.yaml")
UNIT, PORT = "ddtest.service", "30100"
UNIT_PATH = f"/etc/systemd/system/{UNIT}"
ENV_PATH = "/etc/ddops/ddtest.env"
HISTORY = f"/var/lib/ddops/history/{UNIT}"
MODELS = "/var/lib/ddops/models"
TARGET = ("--unit", UNIT, "--port", PORT)


class Site:
    """One lab host as the tests see it: the CLI, a connection, and the service URL."""

    def __init__(self, lab, name: str):
        self.lab, self.name = lab, name
        self.host = lab.host(name)
        self.url = f"http://{self.host.address}:{PORT}"
        self.remote = connect(self.host)

    def ddops(self, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "ddops", *args], cwd=HERE.parent.parent,
                              env={**os.environ, **self.lab.env, **(env or {})}, capture_output=True,
                              text=True, timeout=600, stdin=subprocess.DEVNULL)

    def deploy(self, profile: str, *extra: str, env: dict | None = None) -> tuple[int, dict]:
        done = self.ddops("deploy", profile, "--host", self.name, *TARGET, "--yes", "--json", *extra,
                          env=env)
        assert done.stdout.strip(), done.stderr
        return done.returncode, json.loads(done.stdout)

    def unit_bytes(self) -> bytes | None:
        return self.remote.read(UNIT_PATH)

    def state(self):
        return unit_state(self.remote, UNIT)

    def chat(self, key: str | None = TEST_API_KEY) -> httpx.Response:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        body = {"model": "tiny-llama", "messages": [{"role": "user", "content": "Name a capital."}],
                "max_tokens": 8, "temperature": 0}
        return httpx.post(f"{self.url}/v1/chat/completions", json=body, headers=headers, timeout=60,
                          trust_env=False)

    def info(self, key: str | None = TEST_API_KEY) -> dict:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        return httpx.get(f"{self.url}/server_info", headers=headers, timeout=30, trust_env=False).json()


@pytest.fixture(scope="module")
def site(deploy_lab, cache_dir):
    target, draft = tiny_pair(cache_dir)
    wide = wide_draft(cache_dir)
    s = Site(deploy_lab, deploy_lab.hosts[-1])
    for model in (target, draft, wide):
        pushed = s.ddops("push-model", str(model), "--host", s.name)
        assert pushed.returncode == 0, pushed.stderr
    s.remote.run(f"systemctl disable --now {UNIT}; rm -rf {UNIT_PATH} {ENV_PATH} "
                 f"/var/lib/ddops/history/{UNIT} /var/lib/ddops/deploy/{UNIT}; systemctl daemon-reload",
                 check=False)
    yield s
    s.remote.run(f"systemctl disable --now {UNIT}", check=False)
    s.remote.close()


def test_plain_deploy_passes_the_gate_and_answers_from_outside(site):
    code, out = site.deploy("cpu-ar")
    assert code == 0, out
    assert out["result"] == "deployed"
    assert [c["name"] for c in out["gate"]["checks"]] == ["health", "generate", "smoke", "server_info"]
    answer = site.chat()
    assert answer.status_code == 200 and answer.json()["choices"][0]["message"]["content"].strip()
    assert site.remote.run(f"stat -c %a {ENV_PATH}").stdout.strip() == "600"
    assert b"# ddops-profile: cpu-ar" in site.unit_bytes()


def test_redeploy_with_nothing_changed_restarts_nothing(site):
    before = site.state()
    code, out = site.deploy("cpu-ar")
    assert (code, out["result"]) == (0, "unchanged")
    after = site.state()
    assert after.started_us == before.started_us and after.main_pid == before.main_pid
    assert after.active == "active"


def test_dry_run_shows_the_diff_and_touches_nothing(site):
    before = site.unit_bytes()
    code, out = site.deploy("cpu-ddtree", "--dry-run")
    assert (code, out["result"]) == (0, "dry-run")
    assert "+    --speculative-algorithm DDTREE" in out["plan"]["unit_diff"]
    assert site.unit_bytes() == before


def test_ddtree_deploy_passes_with_real_speculation(site):
    code, out = site.deploy("cpu-ddtree")
    assert code == 0, out["message"]
    checks = {c["name"]: c for c in out["gate"]["checks"]}
    assert checks["acceptance"]["ok"]
    info = site.info()
    assert info["speculative_algorithm"] == "DDTREE"
    assert info["internal_states"][0]["avg_spec_accept_length"] > 1
    assert site.chat().status_code == 200


def test_a_forced_mismatched_draft_fails_the_gate_is_diagnosed_and_reverted(site):
    before, running = site.unit_bytes(), site.info()["speculative_algorithm"]
    code, out = site.deploy(MISMATCH, "--force")   # planning refuses it without --force
    assert code == 1, out
    assert out["result"] == "reverted"
    assert out["diagnosis"][0]["cause"] == "draft-target-width-mismatch", out["diagnosis"]
    assert "draft expects 192" in out["plan"]["refusals"][0]["reason"]
    meta = site.remote.run(f"cat /var/lib/ddops/history/{UNIT}/{out['history_entry']}-*/meta.json").stdout
    assert json.loads(meta)["forced"][0]["check"] == "draft-target"
    assert site.unit_bytes() == before
    assert site.state().active == "active"
    assert site.chat().status_code == 200
    assert site.info()["speculative_algorithm"] == running


def test_a_crash_at_start_fails_fast_and_names_the_missing_model(site):
    before = site.unit_bytes()
    code, out = site.deploy(MISSING_MODEL, "--force")    # planning refuses it without --force
    assert code == 1, out
    [health] = out["gate"]["checks"]
    assert not health["ok"] and health["seconds"] < 60      # the unit was watched: no 180 s wait
    assert out["diagnosis"][0]["cause"] == "model-path-missing"
    assert "not-pushed" in out["diagnosis"][0]["evidence"]
    assert site.unit_bytes() == before and site.state().active == "active"
    assert site.chat().status_code == 200


def test_preflight_catches_the_mismatch_without_starting_anything(site):
    before = site.state()
    done = site.ddops("preflight", MISMATCH, "--host", site.name)
    assert done.returncode == 2, done.stdout
    assert "draft expects 192" in done.stdout and "= 128" in done.stdout
    assert site.state().started_us == before.started_us
    ok = site.ddops("preflight", "cpu-ddtree", "--host", site.name)
    assert ok.returncode == 0, ok.stdout


def test_second_deploy_is_refused_while_the_lock_is_held(site):
    before = site.unit_bytes()
    holder = Holder("alice", "ci-runner-7", 4242, "ddops deploy cpu-ar --host x", time.time())
    with connect(site.host) as remote, HostLock(remote, holder):
        code, out = site.deploy("cpu-dflash")
    assert (code, out["meaning"], out["result"]) == (4, "lock held", "locked"), out
    assert "alice@ci-runner-7 pid 4242" in out["error"] and out["holder"]["user"] == "alice"
    assert site.unit_bytes() == before


def test_a_command_that_exits_non_zero_is_not_a_lost_connection(site):
    with pytest.raises(CommandFailed) as failed:
        site.remote.run("echo no >&2; exit 3")
    assert failed.value.result.exit_code == 3 and "exited 3: no" in str(failed.value)
    assert not site.remote.lost(failed.value) and site.remote.run("echo up").stdout == "up\n"


def test_rollback_to_an_earlier_history_entry(site):
    done = site.ddops("history", "--host", site.name, "--unit", UNIT, "--json")
    entries = json.loads(done.stdout)["entries"]
    first = entries[0]
    assert (first["profile"], first["result"]) == ("cpu-ar", "passed")
    assert [e["result"] for e in entries][-1] == "failed-reverted"
    back = site.ddops("rollback", "--host", site.name, "--unit", UNIT, "--to", first["id"], "--yes", "--json")
    assert back.returncode == 0, back.stdout + back.stderr
    assert json.loads(back.stdout)["rolled_back_to"] == first["id"]
    assert b"# ddops-profile: cpu-ar" in site.unit_bytes()
    assert site.info()["speculative_algorithm"] is None


def test_a_deploy_killed_midway_is_recovered_by_the_next_run(site):
    good = site.unit_bytes()
    cmd = [sys.executable, "-m", "ddops", "deploy", "cpu-ddtree", "--host", site.name, *TARGET, "--yes"]
    proc = subprocess.Popen(cmd, env={**os.environ, **site.lab.env}, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while b"cpu-ddtree" not in (site.unit_bytes() or b"") and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert b"cpu-ddtree" in site.unit_bytes(), "the deploy never pushed its unit"
    assert site.remote.exists(f"/var/lib/ddops/deploy/{UNIT}/pending.json")
    code, out = site.deploy("cpu-ar")
    assert code == 0, out
    notes = " ".join(out["notes"])
    assert "recovered an unfinished deploy of cpu-ddtree" in notes
    assert "stale lock" in notes
    assert site.unit_bytes() == good
    assert not site.remote.exists(f"/var/lib/ddops/deploy/{UNIT}/pending.json")
    listing = json.loads(site.ddops("history", "--host", site.name, "--unit", UNIT, "--json").stdout)
    assert ("cpu-ddtree", "killed-recovered") in [(e["profile"], e["result"]) for e in listing["entries"]]
    assert site.chat().status_code == 200


def test_a_loopback_only_service_is_gated_through_the_ssh_connection(site):
    code, out = site.deploy(LOOPBACK)
    assert code == 0, out
    assert out["gate"]["passed"]
    with pytest.raises(httpx.ConnectError):
        site.chat()
    status = json.loads(site.ddops("status", "--host", site.name, "--unit", UNIT, "--json").stdout)
    [row] = status["units"]
    assert (row["active"], row["health"], row["profile"]) == ("active", "200", "cpu-ar-loopback")


def test_a_failed_revert_exits_3_and_says_what_the_host_holds(site):
    code, _ = site.deploy("cpu-ar")
    assert code == 0
    models = "/var/lib/ddops/models"
    site.remote.run(f"mv {models}/tiny-llama {models}/tiny-llama.away")
    try:
        code, out = site.deploy("cpu-dflash", "--force")   # cannot start, and neither can cpu-ar any more
    finally:
        site.remote.run(f"mv {models}/tiny-llama.away {models}/tiny-llama")
    assert code == 3, out
    assert out["result"] == "revert-failed"
    assert "restored byte for byte but NOT healthy" in out["message"] and "service is down" in out["message"]
    assert b"# ddops-profile: cpu-ar" in site.unit_bytes()
    code, out = site.deploy("cpu-ar")             # the model is back: the next deploy brings it up
    assert code == 0, out
    assert "recovered the failed revert of a deploy of cpu-dflash" in " ".join(out["notes"])
    assert site.chat().status_code == 200


def test_a_history_holding_at_signs_and_frame_separators_lists(site, tmp_path):
    """`@@` and the history framing's own separators (space, +, -) in every field a deploy records
    that may hold them: the model path (gate spec, the forced refusals and the diagnosis's journal
    evidence of the MISSING_MODEL entry above, the gate's details), the smoke message (gate spec),
    the profile's path (the holder's command) and name (+ and -). (The tiny model answers a smoke
    message holding a newline with newlines only; newlines and NULs in every field:
    tests/ops/test_framing.py.) The last test rolls back to this entry."""
    odd = tmp_path / "odd@@ +-"
    odd.mkdir()
    model = f"{MODELS}/tiny@@ +-llama"
    site.remote.run(f"rm -rf {shlex.quote(model)} && cp -r {MODELS}/tiny-llama {shlex.quote(model)}")
    (odd / "cpu-ar+-odd.yaml").write_text(yaml.safe_dump({"extends": "cpu-ar", "model": {"path": model}, "smoke": {
        "messages": [{"role": "user", "content": "Count from one to ten in words. @@ +-"}]}}))
    code, out = site.deploy(str(odd / "cpu-ar+-odd.yaml"))
    assert code == 0, out
    listed = site.ddops("history", "--host", site.name, "--unit", UNIT, "--json")
    assert listed.returncode == 0, listed.stdout + listed.stderr
    entries = {e["id"]: e for e in json.loads(listed.stdout)["entries"]}
    assert "odd@@ +-/cpu-ar+-odd.yaml" in entries[out["history_entry"]]["command"]
    gone = next(e for e in entries.values() if e["profile"] == "cpu-ar-missing-model")
    assert (gone["result"], gone["diagnosis"]) == ("failed-reverted", ["model-path-missing"])
    meta = json.loads(site.remote.run(f"cat {HISTORY}/{gone['id']}-*/meta.json").stdout)
    assert "@@ +-/not-pushed" in meta["forced"][0]["reason"] and "@@ +-" in meta["diagnosis"][0]["evidence"]
    site.odd_entry, site.odd_model = out["history_entry"], model


def test_secrets_reach_only_the_0600_env_file(site):
    key = "sk-ddtest-4f1d9c"
    code, out = site.deploy(WITH_KEY, env={"DDTEST_API_KEY": key})
    assert code == 0, out
    assert key not in json.dumps(out)
    assert site.chat(None).status_code == 401 and site.chat(key).status_code == 200
    env_file = site.remote.run(f"stat -c %a {ENV_PATH}; cat {ENV_PATH}").stdout
    assert env_file.startswith("600") and key in env_file
    assert key not in site.remote.run("ps -eo args").stdout
    assert key not in site.unit_bytes().decode()
    listing = site.ddops("history", "--host", site.name, "--unit", UNIT, "--json").stdout
    logs = site.ddops("logs", "--host", site.name, "--unit", UNIT, "-n", "300").stdout
    assert key not in listing and key not in logs



def test_a_rollback_to_an_entry_holding_at_signs_passes_its_gate(site):
    back = site.ddops("rollback", "--host", site.name, "--unit", UNIT, "--to", site.odd_entry, "--yes", "--json")
    assert back.returncode == 0, back.stdout + back.stderr
    gate = json.loads(back.stdout)["gate"]      # the key is the one the secrets test left on the host
    assert gate["passed"] and site.odd_model in gate["checks"][-1]["detail"], gate
