"""SSH lost in the middle of a command: exit 3 with one JSON document (or one line), never a
traceback, and no paramiko log lines on stderr. The connection to a real lab host goes through
a loopback forwarder that cuts it a fixed time after it opened."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import yaml

from ddops import exits
from tests.deploy.cutting_proxy import CuttingProxy
from tests.deploy.models import tiny_pair
from tests.deploy.test_lab_deploy import HERE

pytestmark = pytest.mark.lab


@pytest.fixture(scope="module")
def cut_inventory(deploy_lab, cache_dir, tmp_path_factory):
    """An inventory reaching the first lab host through a CuttingProxy; returns (path, proxy).
    The deploy's model is on the host first, so planning lets it go on until the cut."""
    host = deploy_lab.host(deploy_lab.hosts[0])
    target, _ = tiny_pair(cache_dir)
    assert deploy_lab.ddops("push-model", str(target), "--host", host.name).returncode == 0
    made = []

    def make(cut_after_s: float):
        proxy = CuttingProxy((host.address, host.ssh_port), cut_after_s)
        folder = tmp_path_factory.mktemp("cut")
        keys = [line.split(None, 1)[1] for line in host.known_hosts.read_text().splitlines()
                if line.startswith(host.address + " ")]
        (folder / "known_hosts").write_text("".join(f"[127.0.0.1]:{proxy.port} {k}\n" for k in keys))
        entry = {"address": "127.0.0.1", "ssh_port": proxy.port, "ssh_user": host.ssh_user,
                 "ssh_key": str(host.ssh_key), "known_hosts": str(folder / "known_hosts")}
        (folder / "inventory.yaml").write_text(yaml.safe_dump({"hosts": {host.name: entry}}))
        made.append(proxy)
        return folder / "inventory.yaml", host.name, proxy

    yield make
    for proxy in made:
        proxy.close()


def ddops(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ddops", *args], cwd=HERE.parent.parent, env=os.environ,
                          capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)


@pytest.mark.parametrize("cut_after_s", [0.6, 1.2, 2.5])
def test_a_deploy_losing_its_connection_exits_3_with_json(cut_inventory, cut_after_s):
    inventory, name, proxy = cut_inventory(cut_after_s)
    done = ddops("deploy", "cpu-ar", "--host", name, "--unit", "ddcut.service", "--port", "30120",
                 "--yes", "--json", "--inventory", str(inventory))
    assert proxy.cuts >= 1
    assert done.returncode == 3, done.stdout + done.stderr
    doc = json.loads(done.stdout)
    # cut before the change began: the shell's envelope; once it began: the deploy's own document
    assert (doc["exit_code"], doc["meaning"]) == (3, exits.MEANING[3]) and doc["error"], doc
    assert doc.get("result", "host-error") in ("host-error", "revert-failed"), doc
    assert "Traceback" not in done.stderr and "Exception" not in done.stderr, done.stderr


def test_a_read_only_command_losing_its_connection_exits_3_in_one_line(cut_inventory):
    inventory, name, proxy = cut_inventory(0.6)
    done = ddops("logs", "--host", name, "--unit", "ddcut.service", "--follow", "--inventory", str(inventory))
    assert done.returncode == 3, done.stdout + done.stderr
    assert done.stderr.startswith("error: ") and "connection lost" in done.stderr.splitlines()[0]
    assert "Traceback" not in done.stderr and "Exception" not in done.stderr, done.stderr


HOLD = """
import sys, time
from ddops.deploy.lock import Holder, HostLock
from ddops.inventory import load_inventory
from ddops.remote import connect
with connect(load_inventory(sys.argv[1]).hosts[sys.argv[2]]) as remote, HostLock(remote, Holder.here("test holder")):
    print("held", flush=True)
    time.sleep(3600)
"""


def test_a_lock_whose_holder_died_while_its_link_was_down_is_released_by_the_next_command(cut_inventory, deploy_lab):
    """The host never hears that the holder died (the link is down when it is killed), so its
    lock command lives on; the next command on this machine sees the holder's pid is gone and
    releases that lock itself, instead of refusing with exit 4 until sshd notices (hours)."""
    inventory, name, proxy = cut_inventory(3600)
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(inventory), name], cwd=HERE.parent.parent,
                              stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    proxy.drop()
    holder.kill()
    holder.wait(timeout=30)
    from ddops.deploy.lock import current_holder
    from ddops.remote import connect
    with connect(deploy_lab.host(name)) as remote:
        assert current_holder(remote)["pid"] == holder.pid   # still held on the host, by a dead process

    done = deploy_lab.ddops("recover", "--host", name, "--yes", "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    settled = json.loads(done.stdout)["settled"]
    assert any(s.startswith("released the lock of") and f"pid {holder.pid}" in s for s in settled), settled
    with connect(deploy_lab.host(name)) as remote:
        assert current_holder(remote) is None
