"""A hand-written unit adopted as history entry 0 comes back byte for byte when a rollout over
its host halts (real lab hosts, the bundled runtime, a real rollout)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import yaml

from ddops.deploy import history
from ddops.remote import connect
from tests.deploy.models import tiny_pair
from tests.deploy.test_lab_deploy import HERE

pytestmark = pytest.mark.lab

UNIT, PORT = "hand.service", 30140
UNIT_PATH, ENV_PATH = f"/etc/systemd/system/{UNIT}", "/etc/default/hand"
MODELS = "/var/lib/ddops/models"
HAND_UNIT = textwrap.dedent(f"""\
    # written by hand, long before ddops
    [Unit]
    Description=tiny model, started by hand

    [Service]
    EnvironmentFile=-{ENV_PATH}
    ExecStart=/opt/ddops/venv/bin/python -m serving --model-path {MODELS}/tiny-llama --host 0.0.0.0 \\
        --port {PORT} --device cpu --dtype float32 --context-length 256
    Restart=on-failure

    [Install]
    WantedBy=multi-user.target
    """)
HAND_ENV = "OMP_NUM_THREADS=1\nPYTHONUNBUFFERED=1\n"
CANDIDATE = f"extends: cpu-ar\nservice: {{unit: {UNIT}, port: {PORT}}}\nmemory: {{context_length: 512}}\n"


def ddops(lab, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ddops", *args], cwd=HERE.parent.parent,
                          env={**os.environ, **lab.env}, capture_output=True, text=True, timeout=900,
                          stdin=subprocess.DEVNULL)


@pytest.fixture(scope="module")
def hand(deploy_lab, cache_dir):
    target, _ = tiny_pair(cache_dir)
    hosts = deploy_lab.hosts[:2]
    for name in hosts:
        assert ddops(deploy_lab, "push-model", str(target), "--host", name).returncode == 0
        with connect(deploy_lab.host(name)) as remote:
            remote.run(f"systemctl disable --now {UNIT}; rm -rf {UNIT_PATH} {ENV_PATH} /etc/ddops/hand.env "
                       f"/var/lib/ddops/history/{UNIT} /var/lib/ddops/deploy/{UNIT}; systemctl daemon-reload",
                       check=False)
    with connect(deploy_lab.host(hosts[0])) as remote:
        remote.write(UNIT_PATH, HAND_UNIT)
        remote.write(ENV_PATH, HAND_ENV)
        remote.run(f"systemctl daemon-reload && systemctl enable --now {UNIT}")
    yield deploy_lab, hosts
    for name in hosts:
        with connect(deploy_lab.host(name)) as remote:
            remote.run(f"systemctl disable --now {UNIT}; rm -f {UNIT_PATH}", check=False)


def test_adopt_records_entry_0_and_refuses_twice(hand):
    lab, (first, _) = hand
    shown = json.loads(ddops(lab, "adopt", "--host", first, "--unit", UNIT, "--dry-run", "--json").stdout)
    assert shown["dry_run"] and [s["action"] for s in shown["steps"]] == ["record"] and shown["env_path"] == ENV_PATH
    with connect(lab.host(first)) as remote:
        assert history.entries(remote, UNIT) == []                  # the dry run recorded nothing
    done = ddops(lab, "adopt", "--host", first, "--unit", UNIT, "--profile", "cpu-ar", "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    doc = json.loads(done.stdout)
    assert (doc["history_entry"], doc["result"], doc["env_path"]) == ("0000", "adopted", ENV_PATH)
    again = ddops(lab, "adopt", "--host", first, "--unit", UNIT, "--json")
    assert again.returncode == 2 and "already has 1 history entry" in json.loads(again.stdout)["error"]


def test_a_halted_rollout_restores_the_adopted_unit_byte_for_byte(hand, tmp_path):
    lab, (first, second) = hand
    (tmp_path / "hand-short.yaml").write_text(CANDIDATE)
    plan = tmp_path / "plan.yaml"
    plan.write_text(yaml.safe_dump({"profile": str(tmp_path / "hand-short.yaml"), "hosts": [first, second],
                                    "canary": 1, "wave_size": 1, "max_failures": 0}))
    with connect(lab.host(second)) as remote:      # the second host cannot take the candidate
        remote.run(f"mv {MODELS}/tiny-llama {MODELS}/tiny-llama.away")
    try:
        done = ddops(lab, "rollout", str(plan), "--yes", "--json")
    finally:
        with connect(lab.host(second)) as remote:
            remote.run(f"mv {MODELS}/tiny-llama.away {MODELS}/tiny-llama")
    doc = json.loads(done.stdout)
    assert doc["status"] == "halted", doc
    assert {h: s["status"] for h, s in doc["hosts"].items()} == {first: "reverted", second: "refused"}
    with connect(lab.host(first)) as remote:
        assert remote.read(UNIT_PATH) == HAND_UNIT.encode()
        assert remote.read(ENV_PATH) == HAND_ENV.encode()
        assert remote.run(f"systemctl is-active {UNIT}").stdout.strip() == "active"
