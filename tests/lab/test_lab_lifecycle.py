"""A lab of its own, from up to down: a bare host, install-runtime onto it, recovery from a killed
supervisor, and a `lab down` that leaves no namespace, bridge, veth, cgroup, mount or process."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ddops.install.bundled import MARKER
from ddops.inventory import load_inventory
from ddops.remote import connect
from tests.fixtures_lab import REPO, ddops, lab_env, lab_skip_reason

pytestmark = pytest.mark.lab
ENV = lab_env("ddlc", "2")
STATE = Path(ENV["DDOPS_LAB_DIR"])


@pytest.fixture(scope="module")
def bare_lab():
    reason = lab_skip_reason()
    if reason:
        pytest.skip(reason)
    up = ddops(ENV, "lab", "up", "--bare", "-n", "1")
    assert up.returncode == 0, up.stdout + up.stderr
    yield load_inventory(Path(ENV["DDOPS_INVENTORY"])).hosts["bare-1"]
    ddops(ENV, "lab", "down")


def test_bare_host_has_no_runtime_until_install_runtime_puts_it_there(bare_lab):
    with connect(bare_lab) as remote:
        assert not remote.exists("/opt/ddops/venv/bin/python")
    shown = ddops(ENV, "install-runtime", "--host", "bare-1", "--dry-run", timeout=1200)
    assert shown.returncode == 0 and "bare-1: would create /opt/ddops/venv, push and install" in shown.stdout, \
        shown.stdout + shown.stderr
    with connect(bare_lab) as remote:
        assert not remote.exists("/opt/ddops/venv") and not remote.exists("/var/lib/ddops/wheelhouse")   # nothing changed
    installed = ddops(ENV, "install-runtime", "--host", "bare-1", timeout=1200)
    assert installed.returncode == 0, installed.stdout + installed.stderr
    assert "dependency wheel(s) installed; ddops installed" in installed.stdout
    with connect(bare_lab) as remote:
        help_text = remote.run("/opt/ddops/venv/bin/python -m serving --help", timeout=120).stdout
        assert "--model-path" in help_text
        assert remote.run("/opt/ddops/venv/bin/python -c 'import torch; print(torch.__version__)'",
                          timeout=120).stdout.startswith("2.13.0")
        installed_sources = remote.read_text(MARKER)
    again = ddops(ENV, "install-runtime", "--host", "bare-1", timeout=600)
    # No dependency wheel travels again; the project wheel only when the sources changed meanwhile
    # (the host's marker holds the digest of the sources installed last).
    assert again.returncode == 0 and "dependencies already installed" in again.stdout
    with connect(bare_lab) as remote:
        changed = remote.read_text(MARKER) != installed_sources
    assert ("ddops installed" if changed else "ddops already current") in again.stdout
    shown = ddops(ENV, "install-runtime", "--host", "bare-1", "--dry-run", timeout=600)
    assert "bare-1: /opt/ddops/venv is current; nothing to do" in shown.stdout, shown.stdout + shown.stderr


def test_lab_up_recovers_a_host_whose_supervisor_was_killed(bare_lab):
    pid = int((STATE / "hosts/bare-1/pid").read_text())
    os.killpg(pid, signal.SIGKILL)
    time.sleep(0.5)
    up = ddops(ENV, "lab", "up", "--bare", "-n", "1")
    assert up.returncode == 0, up.stdout + up.stderr
    assert "cleaning stale bare-1" in up.stdout
    with connect(bare_lab) as remote:
        assert remote.run("hostname").stdout.strip() == "bare-1"
    assert int((STATE / "hosts/bare-1/pid").read_text()) != pid


def test_lab_down_leaves_no_namespace_bridge_link_cgroup_mount_or_process(bare_lab):
    down = ddops(ENV, "lab", "down")
    assert down.returncode == 0, down.stderr
    assert "bare-1 halted and removed" in down.stdout
    assert not [n for n in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()
                if n.startswith("ddlc-")]
    assert not [p for p in Path("/sys/class/net").iterdir() if p.name.startswith("ddlc")]
    assert not list(Path("/sys/fs/cgroup").glob("*/ddlc")) and not Path("/sys/fs/cgroup/ddlc").exists()
    assert str(STATE) not in Path("/proc/self/mountinfo").read_text()
    assert not list(Path("/run/systemd/nspawn/propagate").glob("ddlc-*"))
    assert not [p for p in Path("/proc").glob("[0-9]*/cmdline") if readable(p) and str(STATE).encode() in readable(p)]
    assert [p.name for p in STATE.iterdir()] in ([], [".lock"])
    assert not Path(ENV["DDOPS_INVENTORY"]).exists()
    status = json.loads(ddops(ENV, "lab", "status", "--json").stdout)["hosts"]
    assert status == []


def readable(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError:
        return b""


def test_lab_commands_refuse_to_run_without_root():
    """Same interpreter with the effective uid dropped to nobody: exit 2 and one line, nothing created."""
    code = ("import os, sys; from ddops.cli import app; os.setegid(65534); os.seteuid(65534); "
            "sys.argv = ['ddops', 'lab', 'up', '-n', '1']; app()")
    env = {**os.environ, **lab_env("ddnr", "3")}
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.strip().startswith("error: ddops lab up needs root") and proc.stderr.strip().count("\n") == 0
    assert not Path("/var/lib/ddops/lab-ddnr").exists() and not Path("/run/netns/ddnr-lab-1").exists()
