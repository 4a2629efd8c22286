"""The lab's network: one bridge holding the gateway address, one namespace + veth pair per host.

No forwarding and no default route inside the namespaces: the /24 exists only on the bridge,
so hosts reach each other and the machine, and nothing else.
"""

import time
from pathlib import Path

from ddops.lab import local_commands
from ddops.lab.errors import LabError
from ddops.lab.layout import HostSlot, LabLayout

NETNS_DIR = Path("/run/netns")


def link_exists(name: str) -> bool:
    return Path("/sys/class/net", name).exists()


def netns_exists(name: str) -> bool:
    return (NETNS_DIR / name).exists()


def ensure_bridge(layout: LabLayout) -> None:
    if not link_exists(layout.bridge):
        local_commands.run(["ip", "link", "add", layout.bridge, "type", "bridge"])
    addrs = local_commands.run(["ip", "-o", "-4", "addr", "show", "dev", layout.bridge]).stdout
    if f" {layout.gateway}/24 " not in addrs:
        local_commands.run(["ip", "addr", "add", f"{layout.gateway}/24", "dev", layout.bridge])
    local_commands.run(["ip", "link", "set", layout.bridge, "up"])


def remove_bridge(layout: LabLayout) -> None:
    if link_exists(layout.bridge):
        local_commands.run(["ip", "link", "delete", layout.bridge])


def create_host_net(layout: LabLayout, slot: HostSlot) -> None:
    """Namespace with eth0 (fixed MAC) at the host's address, its peer enslaved to the bridge."""
    remove_host_net(slot)
    local_commands.run(["ip", "netns", "add", slot.netns])
    local_commands.run(["ip", "link", "add", slot.veth, "type", "veth", "peer", "name", "eth0",
               "address", slot.mac, "netns", slot.netns])
    local_commands.run(["ip", "link", "set", slot.veth, "master", layout.bridge, "up"])
    local_commands.run(["ip", "-n", slot.netns, "addr", "add", f"{slot.address}/24", "dev", "eth0"])
    local_commands.run(["ip", "-n", slot.netns, "link", "set", "lo", "up"])
    local_commands.run(["ip", "-n", slot.netns, "link", "set", "eth0", "up"])


def remove_host_net(slot: HostSlot) -> None:
    """Deleting the namespace destroys eth0 and with it the peer; the explicit delete covers a half-made pair."""
    if netns_exists(slot.netns):
        local_commands.run(["ip", "netns", "delete", slot.netns])
    for _ in range(50):   # the kernel destroys the peer asynchronously after the namespace goes
        if not link_exists(slot.veth):
            return
        local_commands.run(["ip", "link", "delete", slot.veth], check=False)
        time.sleep(0.1)
    raise LabError(f"{slot.veth}: veth still present after deleting namespace {slot.netns}")


def lab_namespaces(layout: LabLayout) -> list[str]:
    if not NETNS_DIR.is_dir():
        return []
    return sorted(p.name for p in NETNS_DIR.iterdir() if p.name.startswith(f"{layout.prefix}-"))
