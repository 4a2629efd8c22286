"""How ddops reaches a real lab host: `ddops hosts trust` (fingerprint shown, recorded only when
confirmed), an ~/.ssh/config-style Host alias, and the SSH agent when no key file is named."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import yaml

from tests.deploy.test_lab_deploy import HERE

pytestmark = pytest.mark.lab


def ddops(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ddops", *args], cwd=HERE.parent.parent,
                          env={**os.environ, **(env or {})}, capture_output=True, text=True, timeout=120,
                          stdin=subprocess.DEVNULL)


def inventory(folder, name: str, entry: dict):
    path = folder / "inventory.yaml"
    path.write_text(yaml.safe_dump({"hosts": {name: entry}}))
    return str(path)


def test_hosts_trust_shows_the_fingerprint_and_records_only_when_confirmed(deploy_lab, tmp_path):
    host = deploy_lab.host(deploy_lab.hosts[0])
    known = tmp_path / "known_hosts"
    inv = inventory(tmp_path, host.name, {"address": host.address, "ssh_user": "root",
                                         "ssh_key": str(host.ssh_key), "known_hosts": str(known)})
    pub = host.known_hosts.parent / "hosts" / host.name / "ssh_host_ed25519_key.pub"
    expected = subprocess.run(["ssh-keygen", "-lf", str(pub)], capture_output=True, text=True).stdout.split()[1]
    unknown = ddops("status", "--host", host.name, "--inventory", inv)
    # never trusted on first use: the inventory's known_hosts does not exist yet, bad input (2)
    assert unknown.returncode == 2 and "known_hosts" in unknown.stdout, unknown.stdout
    asked = ddops("hosts", "trust", host.name, "--inventory", inv)
    assert asked.returncode == 2 and expected in asked.stdout and not known.exists()
    done = ddops("hosts", "trust", host.name, "--inventory", inv, "--yes")
    assert done.returncode == 0, done.stdout + done.stderr
    assert known.read_text().startswith(f"{host.address} ssh-ed25519 ")
    assert ddops("status", "--host", host.name, "--inventory", inv).returncode == 0
    again = ddops("hosts", "trust", host.name, "--inventory", inv)
    assert again.returncode == 0 and "already trusted" in again.stdout
    subprocess.run(["ssh-keygen", "-q", "-H", "-f", str(known)], check=True, capture_output=True)   # |1|salt|hash
    assert known.read_text().startswith("|1|") and host.address not in known.read_text()
    assert ddops("status", "--host", host.name, "--inventory", inv).returncode == 0
    hashed = ddops("hosts", "trust", host.name, "--inventory", inv)
    assert hashed.returncode == 0 and "already trusted" in hashed.stdout and len(known.read_text().splitlines()) == 1
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "other")], check=True)
    other = (tmp_path / "other.pub").read_text().split()[:2]
    known.write_text(f"{host.address} {' '.join(other)}\n")
    subprocess.run(["ssh-keygen", "-q", "-H", "-f", str(known)], check=True, capture_output=True)
    changed = ddops("hosts", "trust", host.name, "--inventory", inv, "--yes")
    assert changed.returncode == 2 and "DIFFERENT key" in changed.stdout + changed.stderr


def test_a_host_alias_of_an_ssh_config_and_the_agent_reach_the_host(deploy_lab, tmp_path):
    host = deploy_lab.host(deploy_lab.hosts[0])
    config = tmp_path / "ssh_config"
    config.write_text(f"Host far-alias\n  HostName {host.address}\n  User root\n")
    inv = inventory(tmp_path, "far", {"address": "far-alias", "ssh_config": str(config),
                                      "known_hosts": str(host.known_hosts)})
    agent = subprocess.run(["ssh-agent", "-s"], capture_output=True, text=True).stdout
    env = dict(part.split("=", 1) for part in agent.replace(";", "\n").split() if "=" in part)
    try:
        no_agent = ddops("status", "--host", "far", "--inventory", inv, env={"SSH_AUTH_SOCK": ""})
        assert no_agent.returncode == 6                       # no key file named, no agent: refused
        subprocess.run(["ssh-add", str(host.ssh_key)], env={**os.environ, **env}, check=True,
                       capture_output=True)
        with_agent = ddops("status", "--host", "far", "--inventory", inv, "--json", env=env)
        assert with_agent.returncode == 0, with_agent.stdout + with_agent.stderr
    finally:
        subprocess.run(["ssh-agent", "-k"], env={**os.environ, **env}, capture_output=True)
