"""Shadow, switch and fleet rollouts on real lab hosts (systemd-nspawn, sshd, systemd units),
driven through the `ddops` CLI exactly as CI would: --yes --json, exit codes per docs/ci.md.

Profiles are the shipped cpu-* ones, extended in a temp folder only where a test needs a
twist: a loose speed policy for the DDTree candidate (two CPU cores shared by every process
of the test run make speed figures noise; equality is what these tests judge), a different
model, a missing model.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import httpx
import pytest
import yaml

from ddops.remote import connect
from ddops.render import read_header
from tests.conftest import TEST_API_KEY
from tests.rollout import lab_models

pytestmark = pytest.mark.lab
UNIT = "/etc/systemd/system/llm.service"
SHADOW_UNIT = "/etc/systemd/system/llm-shadow.service"
DRAFT = "/var/lib/ddops/models/tiny-llama-dflash"


@pytest.fixture(scope="module")
def lab(lab_hosts, tmp_path_factory, cache_dir):
    """Three lab hosts with the test models, and a profiles folder for the twisted profiles."""
    grown = lab_hosts.ddops("lab", "up", "-n", "3", timeout=1800)
    assert grown.returncode == 0, grown.stdout + grown.stderr
    models = lab_models.build(cache_dir)
    for host in ("lab-1", "lab-2", "lab-3"):
        for name, path in models.items():
            pushed = lab_hosts.ddops("push-model", str(path), "--host", host,
                                     "--dest", f"/var/lib/ddops/models/{name}")
            assert pushed.returncode == 0, pushed.stdout + pushed.stderr
    root = tmp_path_factory.mktemp("rollout-lab")
    profiles = root / "profiles"
    profiles.mkdir()
    # The smoke prompt is one the tiny distilled draft predicts (the shipped cpu-ddtree smoke,
    # "What is the capital of France?", makes the tiny target repeat " 202", which that draft
    # never guesses: accepted length 1.00, and the gate rightly refuses).
    write(profiles, "ro-ddtree", """\
        extends: cpu-ddtree
        smoke:
          messages: [{role: user, content: Write a Python function that prints FizzBuzz for the numbers 1 to 20.}]
        rollout: {min_token_equality: 1.0, max_p95_latency_regression: 20.0, min_tokens_per_s_ratio: 0.01}
        """)
    write(profiles, "ro-other", """\
        extends: cpu-ar
        model: {path: /var/lib/ddops/models/tiny-llama-other, served_name: tiny-llama}
        """)
    write(profiles, "ro-missing", """\
        extends: cpu-ar
        model: {path: /var/lib/ddops/models/not-pushed, served_name: tiny-llama}
        """)
    return Ctx(lab_hosts, root)


def write(folder, name, text):
    (folder / f"{name}.yaml").write_text(textwrap.dedent(text))


class Ctx:
    def __init__(self, lab, root):
        self.lab, self.root = lab, root
        self.env = {**lab.env, "DDOPS_STATE": str(root / "state")}

    def profile(self, name):
        """Shipped profiles by name, the twisted ones by path (they extend shipped ones)."""
        path = self.root / "profiles" / f"{name}.yaml"
        return str(path) if path.is_file() else name

    def ddops(self, *args, timeout=600):
        from tests.fixtures_lab import ddops
        return ddops(self.env, *args, timeout=timeout)

    def popen(self, *args):
        """A `ddops` process that takes SIGINT like one started from a terminal."""
        from tests.fixtures_lab import REPO
        return subprocess.Popen([sys.executable, "-m", "ddops", *args], cwd=REPO, text=True,
                                env={**os.environ, **self.env}, stdout=subprocess.PIPE,
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))

    def json(self, *args, expect):
        result = self.ddops(*args, "--json")
        assert result.returncode == expect, f"{args}: exit {result.returncode}\n{result.stdout}\n{result.stderr}"
        return json.loads(result.stdout)

    def deploy(self, profile, host):
        return self.json("deploy", self.profile(profile), "--host", host, "--yes", expect=0)

    def remote(self, host):
        return connect(self.lab.host(host))

    def unit(self, host, path=UNIT):
        with self.remote(host) as remote:
            return remote.read_text(path)

    def info(self, host, port=30000):
        address = self.lab.host(host).address
        return httpx.get(f"http://{address}:{port}/server_info", timeout=10, trust_env=False,
                         headers={"Authorization": f"Bearer {TEST_API_KEY}"}).json()

    def main_pid(self, host, unit="llm.service"):
        with self.remote(host) as remote:
            return remote.run(f"systemctl show -p ExecMainPID --value {unit}").stdout.strip()


def test_ddtree_shadow_matches_plain_production_then_promotes(lab):
    lab.deploy("cpu-ar", "lab-1")
    started = lab.json("shadow", "start", lab.profile("ro-ddtree"), "--host", "lab-2", "--production-host", "lab-1",
                       "--yes", expect=0)
    shadow = started["shadow"]
    assert shadow["unit"] == "llm-shadow.service" and shadow["port"] == 30001
    assert shadow["url"] == f"http://{lab.lab.host('lab-2').address}:30001"

    compared = lab.json("shadow", "compare", "--count", "4", "--max-tokens", "16", expect=0)
    comparison = compared["comparison"]
    assert comparison["token_equality"] == 1.0 and comparison["prompts_equal"] == 4
    assert comparison["shadow"]["accept_length"] > 1.0  # speculation really ran on the shadow
    assert comparison["production"]["accept_length"] == 1.0
    assert compared["verdict"]["passed"] is True
    saved = json.loads(open(compared["results_file"]).read())
    assert saved["verdict"]["passed"] is True and saved["shadow"]["host"] == "lab-2"

    promoted = lab.json("shadow", "promote", "--yes", expect=0)
    assert promoted["status"] == "promoted"
    assert read_header(lab.unit("lab-1"))["profile"] == "ro-ddtree"
    assert lab.info("lab-1")["speculative_algorithm"] == "DDTREE"
    assert lab.unit("lab-2", SHADOW_UNIT) is None  # shadow unit removed from its host
    assert lab.json("shadow", "status", expect=0)["shadow"] is None


def test_wrong_shadow_is_caught_and_abort_leaves_production_untouched(lab):
    lab.deploy("cpu-ar", "lab-1")
    unit_before, pid_before = lab.unit("lab-1"), lab.main_pid("lab-1")
    lab.json("shadow", "start", lab.profile("ro-other"), "--host", "lab-1", "--yes", expect=0)  # same host, port 30001

    compared = lab.json("shadow", "compare", "--count", "4", "--max-tokens", "16", expect=1)
    assert compared["comparison"]["token_equality"] < 1.0
    assert compared["verdict"]["passed"] is False
    assert any(r.startswith("token equality") for r in compared["verdict"]["reasons"])

    aborted = lab.json("shadow", "abort", "--yes", expect=0)
    assert aborted["status"] == "aborted"
    assert lab.unit("lab-1", SHADOW_UNIT) is None
    assert lab.unit("lab-1") == unit_before and lab.main_pid("lab-1") == pid_before  # not even restarted
    assert lab.info("lab-1")["model_path"] == "/var/lib/ddops/models/tiny-llama"


def test_switch_forward_then_automatic_revert_on_a_failing_profile(lab):
    lab.deploy("cpu-ar", "lab-2")
    forward = lab.json("switch", lab.profile("ro-ddtree"), "--host", "lab-2", "--yes", expect=0)
    assert forward["status"] == "switched" and forward["from"]["profile"] == "cpu-ar"
    assert forward["from"]["server_info"]["speculative_algorithm"] in (None, "NONE", "")
    assert forward["gpu"]["status"] == "absent"  # CPU lab host: said so, and went on
    assert lab.info("lab-2")["speculative_algorithm"] == "DDTREE"
    good_unit = lab.unit("lab-2")

    pid = lab.main_pid("lab-2")
    refused = lab.json("switch", lab.profile("ro-missing"), "--host", "lab-2", "--yes", expect=2)
    assert refused["status"] == "refused" and "not-pushed/config.json" in refused["detail"]
    assert lab.unit("lab-2") == good_unit and lab.main_pid("lab-2") == pid  # not even stopped
    failed = lab.json("switch", lab.profile("ro-missing"), "--host", "lab-2", "--yes", "--force", expect=1)
    assert failed["status"] == "reverted" and failed["from"]["profile"] == "ro-ddtree"
    assert lab.unit("lab-2") == good_unit  # the last good profile, byte for byte
    assert lab.info("lab-2")["speculative_algorithm"] == "DDTREE"  # and answering again


def test_three_host_rollout_with_one_failing_host_halts_and_reverts(lab, tmp_path):
    hosts = ["lab-1", "lab-2", "lab-3"]
    base = tmp_path / "base.yaml"
    base.write_text(yaml.safe_dump({"profile": "cpu-ar", "hosts": hosts, "canary": 1, "wave_size": 2}))
    events = lab.ddops("rollout", str(base), "--yes", "--json-events")
    lines = [json.loads(line) for line in events.stdout.splitlines()]
    assert events.returncode == 0 and lines[-1]["event"] == "result" and lines[-1]["status"] == "succeeded"
    assert [e["host"] for e in lines if e["event"] == "host" and e["status"] == "running"][0] == "lab-1"

    with lab.remote("lab-2") as remote:  # lab-2 loses the draft the candidate needs
        remote.run(f"mv {DRAFT} {DRAFT}.hidden")
    try:
        plan = tmp_path / "ddtree.yaml"
        plan.write_text(yaml.safe_dump({"profile": lab.profile("ro-ddtree"), "hosts": hosts, "canary": 1,
                                        "wave_size": 2, "max_failures": 0}))
        doc = lab.json("rollout", str(plan), "--yes", expect=1)
    finally:
        with lab.remote("lab-2") as remote:
            remote.run(f"mv {DRAFT}.hidden {DRAFT}")
    assert doc["exit_code"] == 1 and doc["status"] == "halted"
    assert doc["waves"] == [["lab-1"], ["lab-2", "lab-3"]]
    statuses = {h: s["status"] for h, s in doc["hosts"].items()}
    assert statuses == {"lab-1": "reverted", "lab-2": "refused", "lab-3": "reverted"}   # planning knew: lab-2 untouched
    for host in hosts:  # every host back on what it ran before the rollout, and serving
        assert read_header(lab.unit(host))["profile"] == "cpu-ar"
        assert lab.info(host)["speculative_algorithm"] in (None, "NONE", "")


STUB_SMI = """#!/bin/sh
# Stands in for the NVIDIA driver's tool on a GPU-less lab host: one stray process holds the card.
case "$*" in
  *query-compute-apps*) echo "4242, python3 -m sglang.launch_server, 40112";;
  *query-gpu*) echo "8000";;
esac
"""


def test_switch_refuses_while_the_gpu_is_held_and_restarts_the_running_unit(lab):
    lab.deploy("cpu-ar", "lab-3")
    unit_before = lab.unit("lab-3")
    with lab.remote("lab-3") as remote:
        remote.write("/usr/local/bin/nvidia-smi", STUB_SMI, mode=0o755)
    try:
        refused = lab.json("switch", lab.profile("ro-other"), "--host", "lab-3", "--gpu-timeout", "1",
                           "--yes", expect=1)
    finally:
        with lab.remote("lab-3") as remote:
            remote.run("rm -f /usr/local/bin/nvidia-smi")
    assert refused["status"] == "refused" and refused["gpu"]["status"] == "busy"
    assert refused["gpu"]["processes"] == [{"pid": 4242, "name": "python3 -m sglang.launch_server",
                                            "used_mib": 40112}]
    assert lab.unit("lab-3") == unit_before  # never replaced
    assert lab.info("lab-3")["model_path"] == "/var/lib/ddops/models/tiny-llama"  # serving again


def test_interrupted_rollout_resumes_without_redeploying_finished_hosts(lab, tmp_path):
    hosts = ["lab-1", "lab-2", "lab-3"]
    base = tmp_path / "base.yaml"
    base.write_text(yaml.safe_dump({"profile": "cpu-ar", "hosts": hosts, "wave_size": 3}))
    assert lab.ddops("rollout", str(base), "--yes", "--json").returncode == 0
    plan = tmp_path / "other.yaml"
    plan.write_text(yaml.safe_dump({"profile": lab.profile("ro-other"), "hosts": hosts, "canary": 1,
                                    "wave_size": 2, "bake_s": 120}))
    first = lab.popen("rollout", str(plan), "--yes", "--json")
    state_dir = lab.root / "state" / "rollouts"
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and not _canary_done(state_dir):
        time.sleep(0.5)
    first.send_signal(signal.SIGINT)  # during the bake after the canary
    out, _ = first.communicate(timeout=60)
    interrupted = json.loads(out)
    assert first.returncode == 130 and interrupted["status"] == "running"
    assert {h: s["status"] for h, s in interrupted["hosts"].items()} == \
        {"lab-1": "done", "lab-2": "pending", "lab-3": "pending"}

    resumed = lab.ddops("rollout", str(plan), "--yes", "--json-events")
    lines = [json.loads(line) for line in resumed.stdout.splitlines()]
    assert resumed.returncode == 0 and lines[-1]["resumed"] is True and lines[-1]["status"] == "succeeded"
    touched = {e["host"] for e in lines if e["event"] == "host"}
    assert touched == {"lab-2", "lab-3"}  # the canary was not deployed again
    for host in hosts:
        assert read_header(lab.unit(host))["profile"] == "ro-other"


def _canary_done(state_dir) -> bool:
    for path in state_dir.glob("other-*.json"):
        return json.loads(path.read_text())["hosts"]["lab-1"]["status"] == "done"
    return False
