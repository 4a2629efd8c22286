"""The hybrid (Qwen3.5/3.6 layout) DDTree profile deployed to a real lab host and gated.

Models: the tiny hybrid target (serving.tools.tiny --arch qwen3_5) and its distilled DFlash
draft, built once into $DDOPS_CACHE/models/hybrid-<digest of the model tools>, pushed under
the names profiles/cpu-hybrid-ddtree.yaml uses.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from ddops.remote import connect

pytestmark = pytest.mark.lab

REPO = Path(__file__).resolve().parents[2]
TOOLS = ("serving/tools/tiny.py", "serving/tools/tiny_hybrid.py", "serving/tools/tiny_draft.py",
         "serving/tools/train_draft.py")
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
UNIT, PORT = "ddhybrid.service", "30110"


def hybrid_pair(cache: Path) -> tuple[Path, Path]:
    digest = hashlib.sha256()
    for tool in TOOLS:
        digest.update((REPO / tool).read_bytes())
    root = cache / "models" / f"hybrid-{digest.hexdigest()[:12]}"
    target, draft = root / "tiny-qwen3_5", root / "tiny-qwen3_5-dflash"
    if not (draft / "model.safetensors").is_file():
        tmp = root.with_name(root.name + f".tmp{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        for step in (["serving.tools.tiny", "--arch", "qwen3_5", "--out", str(tmp / target.name)],
                     ["serving.tools.tiny_draft", "--target", str(tmp / target.name),
                      "--out", str(tmp / draft.name), "--distill"]):
            subprocess.run([sys.executable, "-m", *step], check=True, env=ENV, capture_output=True, timeout=900)
        shutil.rmtree(root, ignore_errors=True)
        tmp.rename(root)   # atomic: a half-built pair is never picked up
    return target, draft


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
        assert info["kernels"]["linear_attention"] == "torch"
    finally:
        with connect(deploy_lab.host(host)) as remote:
            remote.run(f"systemctl disable --now {UNIT}", check=False)
