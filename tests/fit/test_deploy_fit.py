"""`ddops deploy` refuses a profile predicted not to fit the host's GPUs, unless --force, reading
the model configs on the host over SSH (a real lab host: systemd in nspawn, real sshd).

The lab hosts have no GPU; the test's inventory declares two RTX A6000 for lab-1 and the test
puts the Qwen3.6-27B configs where the profiles point, so the planner runs on the host's files.
Only dry runs go further than the refusal: no SGLang is installed there."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from ddops.remote import connect
from tests.fit.conftest import CONFIGS

pytestmark = pytest.mark.lab
REPO = Path(__file__).resolve().parents[2]
MODELS = "/var/lib/ddops/models"
UNIT = "ddfit.service"


@pytest.fixture(scope="module")
def site(lab_hosts, tmp_path_factory):
    """An inventory giving lab-1 two A6000s, the shipped a6000 profiles plus a greedy one, and
    the 27B configs on the host."""
    tmp = tmp_path_factory.mktemp("fit-deploy")
    host = lab_hosts.host(lab_hosts.hosts[0])
    entry = {"address": host.address, "ssh_port": host.ssh_port, "ssh_user": host.ssh_user,
             "ssh_key": str(host.ssh_key), "known_hosts": str(host.known_hosts),
             "gpu": {"kind": "RTX A6000", "count": 2, "memory_gb": 48}}
    (tmp / "inventory.yaml").write_text(yaml.safe_dump({"hosts": {host.name: entry}}))
    profiles = tmp / "profiles"
    profiles.mkdir()
    for name in ("a6000-base", "a6000-balanced"):
        (profiles / f"{name}.yaml").write_text((REPO / "profiles" / f"{name}.yaml").read_text())
    (profiles / "a6000-greedy.yaml").write_text("extends: a6000-balanced\nmemory: {mem_fraction_static: 0.97}\n")
    placed = [f"{MODELS}/Qwen3.6-27B", f"{MODELS}/Qwen3.6-27B-DFlash"]
    with connect(host) as remote:
        for path in placed:
            remote.put(CONFIGS / Path(path).name / "config.json", f"{path}/config.json")
    yield host.name, tmp
    with connect(host) as remote:
        remote.run("rm -rf " + " ".join(placed), check=False)


def deploy(site, profile: str, *extra: str) -> tuple[int, dict]:
    name, tmp = site
    proc = subprocess.run(
        [sys.executable, "-m", "ddops", "deploy", profile, "--host", name, "--inventory", str(tmp / "inventory.yaml"),
         "--profiles-dir", str(tmp / "profiles"), "--unit", UNIT, "--port", "30150", "--json", *extra],
        cwd=REPO, capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL,
        env={**os.environ, "DDOPS_API_KEY": "fit-test-key"})
    assert proc.stdout.strip(), proc.stderr
    return proc.returncode, json.loads(proc.stdout)


def test_a_profile_that_cannot_fit_is_refused_before_anything_is_written(site, lab_hosts):
    code, doc = deploy(site, "a6000-greedy", "--yes")
    assert code == 2 and doc["result"] == "refused"
    [fit] = [r["reason"] for r in doc["plan"]["refusals"] if r["check"] == "fit"]
    assert "predicted not to fit" in fit and "2 x RTX A6000" in fit and "headroom" in fit
    with connect(lab_hosts.host(site[0])) as remote:
        assert not remote.exists(f"/etc/systemd/system/{UNIT}")


def test_force_goes_on_to_the_plan(site):
    code, doc = deploy(site, "a6000-greedy", "--force", "--dry-run")
    assert code == 0 and doc["result"] == "dry-run"
    assert any(step["action"] == "write-unit" for step in doc["plan"]["steps"])


def test_a_profile_that_fits_is_not_held_back_by_the_fit_check(site):
    code, doc = deploy(site, "a6000-balanced", "--dry-run")
    # refused only because no SGLang is installed on the lab host, never for memory
    assert code == 2 and doc["result"] == "refused", doc
    assert [r["check"] for r in doc["plan"]["refusals"]] == ["runtime"]


def test_fit_on_the_host_reads_its_models_and_its_sglang(site):
    name, tmp = site
    proc = subprocess.run([sys.executable, "-m", "ddops", "fit", "a6000-balanced", "--host", name, "--inventory",
                           str(tmp / "inventory.yaml"), "--profiles-dir", str(tmp / "profiles"), "--json"],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    doc = json.loads(proc.stdout)
    assert doc["fits"] is True and doc["gpu"]["kind"] == "RTX A6000"
    assert doc["models"]["target"]["path"] == f"{MODELS}/Qwen3.6-27B"  # read on the host
    # the lab host runs the bundled runtime only: SGLang is missing, so the launch would fail
    assert doc["sglang"]["host_version"] is None and doc["sglang"]["problems"]
    assert proc.returncode == 1


def test_fit_of_a_cpu_bundled_profile_on_the_host_caps_its_pool_from_the_hosts_memory(site, lab_hosts):
    """The bundled runtime on CPU sizes its pool from the host's memory (MemTotal, lowered to
    the unit's MemoryMax): `fit --host` reads that figure over SSH and says its rows are exact."""
    name, tmp = site
    (tmp / "profiles" / "cpu-pool.yaml").write_text(
        f"runtime: bundled\nmodel: {{path: {MODELS}/Qwen3.6-27B, served_name: q}}\n"
        "memory: {context_length: 4096}\nservice: {device: cpu, unit: ddfit.service}\n")
    proc = subprocess.run([sys.executable, "-m", "ddops", "fit", "cpu-pool", "--host", name, "--inventory",
                           str(tmp / "inventory.yaml"), "--profiles-dir", str(tmp / "profiles"), "--json"],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    pool = json.loads(proc.stdout)["memory"]["pool"]
    with connect(lab_hosts.host(name)) as remote:
        total = int(remote.run("awk '/^MemTotal:/ {print $2}' /proc/meminfo").stdout) * 1024
    assert proc.returncode == 0 and pool["memory_bytes"] == total and pool["exact"] is True, pool
