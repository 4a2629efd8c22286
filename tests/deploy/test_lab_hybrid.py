"""The hybrid (Qwen3.5/3.6 layout) DDTree profile deployed to a real lab host and gated.

Models: tests/hybrid/models.py (the tiny hybrid and its distilled draft), pushed under the
names profiles/cpu-hybrid-ddtree.yaml uses.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from ddops.remote import connect
from tests.hybrid.models import hybrid_pair

pytestmark = pytest.mark.lab
REPO = Path(__file__).resolve().parents[2]

UNIT, PORT = "ddhybrid.service", "30110"


def ddops(lab, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ddops", *args], cwd=REPO, env={**os.environ, **lab.env},
                          capture_output=True, text=True, timeout=900, stdin=subprocess.DEVNULL)


def test_hybrid_ddtree_profile_deploys_and_passes_the_gate(deploy_lab, cache_dir):
    host = deploy_lab.hosts[0]
    for model in hybrid_pair(cache_dir):
        pushed = ddops(deploy_lab, "push-model", str(model), "--host", host)
        assert pushed.returncode == 0, pushed.stderr
    done = ddops(deploy_lab, "deploy", "cpu-hybrid-ddtree", "--host", host, "--unit", UNIT, "--port", PORT,
                 "--yes", "--json")
    try:
        out = json.loads(done.stdout)
        assert done.returncode == 0, out
        checks = {c["name"]: c for c in out["gate"]["checks"]}
        assert checks["acceptance"]["ok"] and checks["smoke"]["ok"]
        address = deploy_lab.host(host).address
        key = {"Authorization": f"Bearer {os.environ['DDOPS_API_KEY']}"}   # set by tests/conftest.py
        info = httpx.get(f"http://{address}:{PORT}/server_info", headers=key, timeout=30, trust_env=False).json()
        assert info["speculative_algorithm"] == "DDTREE"
        assert info["internal_states"][0]["avg_spec_accept_length"] > 1
        assert info["memory"]["state_cache_bytes"] == info["memory"]["predicted_state_cache_bytes"] > 0
        assert info["kernels"]["linear_attention"] == "torch" and info["kernels"]["torch_because"] == "device is cpu"
        # the lab's hosts (debootstrap minbase) have no C compiler or run bf16: the PyTorch form, and why
        assert info["kernels"]["decode_attention"] == "torch" and info["kernels"]["decode_attention_because"]
    finally:
        with connect(deploy_lab.host(host)) as remote:
            remote.run(f"systemctl disable --now {UNIT}", check=False)
