"""pytest plugin: one lab of systemd-nspawn hosts for the whole test session.

`lab_hosts` brings up DDOPS_TEST_LAB_HOSTS (default 2) hosts lab-1..lab-N with the bundled
runtime installed (/opt/ddops/venv, current sources), in a lab of its own (state dir, name
prefix and /24 differ from the user's lab), and tears it down at the end of the session.
Tests drive it through `ddops` subprocesses with `lab.env`, or through ddops.remote with the
Host objects from `lab.inventory`.
"""

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def lab_env(name: str, subnet: str) -> dict[str, str]:
    """Environment selecting a lab of its own: /var/lib/ddops/lab-<name>, prefix <name>, 10.231.<subnet>.0/24."""
    state = f"/var/lib/ddops/lab-{name}"
    return {"DDOPS_LAB_DIR": state, "DDOPS_LAB_PREFIX": name, "DDOPS_LAB_SUBNET": f"10.231.{subnet}",
            "DDOPS_INVENTORY": f"{state}/inventory.yaml"}


def ddops(env: dict[str, str], *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    """Run `python -m ddops ARGS` against the lab selected by env; output captured as text."""
    return subprocess.run([sys.executable, "-m", "ddops", *args], cwd=REPO, env={**os.environ, **env},
                          capture_output=True, text=True, timeout=timeout)


def lab_skip_reason() -> str | None:
    if os.geteuid() != 0:
        return "lab hosts need root"
    if not shutil.which("systemd-nspawn") or not shutil.which("debootstrap"):
        return "systemd-container/debootstrap missing (run `make setup`)"
    return None


@dataclass(frozen=True)
class Lab:
    inventory: Path                 # inventory.yaml of this lab (ddops.inventory.load_inventory reads it)
    hosts: tuple[str, ...]          # host names, lab-1..lab-N
    env: dict[str, str] = field(default_factory=dict)   # selects this lab for `ddops` subprocesses

    def ddops(self, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
        return ddops(self.env, *args, timeout=timeout)

    def host(self, name: str):
        from ddops.inventory import load_inventory
        return load_inventory(self.inventory).hosts[name]


def session_lab() -> tuple[str, int]:
    """This test process's lab name prefix and subnet octet. DDOPS_TEST_LAB / DDOPS_TEST_LAB_SUBNET
    let two test sessions (two checkouts) run side by side; within a session each pytest-xdist
    worker that runs lab tests has a lab of its own (tests/conftest.py: the peer runtimes' lab
    files are a group of their own, so they run beside the other lab files), 20 subnets apart."""
    worker = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw") or 0)
    name = os.environ.get("DDOPS_TEST_LAB", "ddtst") + (str(worker) if worker else "")
    return name, int(os.environ.get("DDOPS_TEST_LAB_SUBNET", "1")) + 20 * worker


@pytest.fixture(scope="session")
def lab_hosts() -> Lab:
    reason = lab_skip_reason()
    if reason:
        pytest.skip(reason)
    count = int(os.environ.get("DDOPS_TEST_LAB_HOSTS", "2"))
    name, subnet = session_lab()
    env = lab_env(name, str(subnet))
    up = ddops(env, "lab", "up", "-n", str(count), timeout=1800)
    if up.returncode != 0:
        ddops(env, "lab", "down")
        pytest.fail(f"lab up failed (exit {up.returncode}):\n{up.stdout}\n{up.stderr}")
    yield Lab(Path(env["DDOPS_INVENTORY"]), tuple(f"lab-{i}" for i in range(1, count + 1)), env)
    down = ddops(env, "lab", "down")
    assert down.returncode == 0, f"lab down failed:\n{down.stdout}\n{down.stderr}"
