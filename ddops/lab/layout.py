"""Where a lab keeps its state and what it names things: one frozen object built from the environment.

Two labs may run side by side (the user's and a test's) as long as their state directory, name
prefix and /24 differ; every name the lab creates on the machine starts with the prefix.
"""

import ipaddress
import os
import re
from dataclasses import dataclass
from pathlib import Path

from ddops.lab.errors import LabUsageError

PREFIX_RE = re.compile(r"^[a-z][a-z0-9]{1,7}$")
HOST_RE = re.compile(r"^(lab|bare)-([1-9][0-9]?)$")
# lab-i gets .10+i, bare-i gets .100+i: addresses never move when hosts are added or removed.
FIRST_OCTET = {"lab": 10, "bare": 100}
MAX_HOSTS = 80


@dataclass(frozen=True)
class LabLayout:
    state_dir: Path   # inventory.yaml, known_hosts, client key, one dir per host (host key, pid, log)
    cache_dir: Path   # root filesystem tarballs and their unpacked trees; survives `lab down`
    prefix: str       # bridge, netns, veth and cgroup names start with it
    subnet: str       # first three octets of the lab's private /24, e.g. "10.231.0"

    @classmethod
    def from_env(cls) -> "LabLayout":
        cache = Path(os.environ.get("DDOPS_CACHE", "/var/cache/ddops"))
        layout = cls(state_dir=Path(os.environ.get("DDOPS_LAB_DIR", "/var/lib/ddops/lab")),
                     cache_dir=cache / "lab",
                     prefix=os.environ.get("DDOPS_LAB_PREFIX", "ddlab"),
                     subnet=os.environ.get("DDOPS_LAB_SUBNET", "10.231.0"))
        layout.validate()
        return layout

    def validate(self) -> None:
        if not PREFIX_RE.match(self.prefix):
            raise LabUsageError(f"DDOPS_LAB_PREFIX={self.prefix!r}: must be 2-8 lower-case letters/digits, starting with a letter")
        try:
            net = ipaddress.ip_network(f"{self.subnet}.0/24")
        except ValueError:
            raise LabUsageError(f"DDOPS_LAB_SUBNET={self.subnet!r}: must be three octets, e.g. 10.231.0") from None
        if not net.is_private:
            raise LabUsageError(f"DDOPS_LAB_SUBNET={self.subnet!r}: must be a private range (the lab never routes out)")

    @property
    def bridge(self) -> str:
        return f"{self.prefix}br0"

    @property
    def gateway(self) -> str:
        return f"{self.subnet}.1"

    @property
    def client_key(self) -> Path:
        return self.state_dir / "id_ed25519"

    @property
    def known_hosts(self) -> Path:
        return self.state_dir / "known_hosts"

    @property
    def inventory(self) -> Path:
        """Where `lab up` writes the inventory: $DDOPS_INVENTORY; else, for the default lab run
        from a source tree, lab/inventory.yaml there (docs/contracts.md section 4); else the state dir.
        ddops.inventory.find_inventory looks in the same places."""
        from ddops.inventory import REPO_LAB_INVENTORY
        if os.environ.get("DDOPS_INVENTORY"):
            return Path(os.environ["DDOPS_INVENTORY"])
        if not os.environ.get("DDOPS_LAB_DIR") and (REPO_LAB_INVENTORY.parent.parent / "pyproject.toml").is_file():
            return REPO_LAB_INVENTORY
        return self.state_dir / "inventory.yaml"

    def host_dir(self, name: str) -> Path:
        return self.state_dir / "hosts" / name



@dataclass(frozen=True)
class HostSlot:
    """Everything the machine-side plumbing of one lab host is called; pure function of name and layout."""

    name: str      # lab-1, bare-1
    bare: bool     # no runtime venv in its root filesystem
    address: str
    mac: str       # fixed per address: a re-created host must not wait on a stale ARP entry
    netns: str     # also the container's machine name (unique across labs); its hostname is `name`
    veth: str      # host side of the pair (<= 15 chars); the container side is eth0

    @classmethod
    def of(cls, layout: LabLayout, name: str) -> "HostSlot":
        match = HOST_RE.match(name)
        if not match or int(match.group(2)) > MAX_HOSTS:
            raise LabUsageError(f"host {name!r}: lab hosts are named lab-N or bare-N with 1 <= N <= {MAX_HOSTS}")
        kind, index = match.group(1), int(match.group(2))
        octet = FIRST_OCTET[kind] + index
        return cls(name=name, bare=kind == "bare", address=f"{layout.subnet}.{octet}",
                   mac=f"02:dd:0a:e7:{int(layout.subnet.split('.')[-1]):02x}:{octet:02x}",
                   netns=f"{layout.prefix}-{name}", veth=f"{layout.prefix}-{octet}")


def host_names(count: int, bare: bool) -> list[str]:
    if not 1 <= count <= MAX_HOSTS:
        raise LabUsageError(f"-n {count}: the lab holds 1 to {MAX_HOSTS} hosts of each kind")
    kind = "bare" if bare else "lab"
    return [f"{kind}-{i}" for i in range(1, count + 1)]
