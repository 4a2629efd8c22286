"""The inventory `lab up` writes: every running lab host, its address, key and known_hosts.

Shape read by ddops.inventory.load_inventory: `hosts: {name: {address, ssh_port, ssh_user,
ssh_key, known_hosts, gpu, labels}}`.
"""

from pathlib import Path

import yaml

from ddops.lab.keys import write_atomic
from ddops.lab.layout import HostSlot, LabLayout

HEADER = "# Written by `ddops lab up`; rewritten on every lab up/down. Lab state: {state}\n"


def render(layout: LabLayout, slots: list[HostSlot], access: dict[str, dict] | None = None) -> str:
    """access: host name -> the fields that reach it another way than root@address (lab/access.py)."""
    hosts = {}
    for slot in slots:
        reach = (access or {}).get(slot.name) or {
            "address": slot.address,
            "ssh_port": 22,
            "ssh_user": "root",
            "ssh_key": str(layout.client_key),
            "known_hosts": str(layout.known_hosts),
        }
        hosts[slot.name] = {
            **reach,
            "gpu": None,
            "labels": {"lab": layout.prefix, "runtime": "none" if slot.bare else "bundled"},
        }
    return HEADER.format(state=layout.state_dir) + yaml.safe_dump({"hosts": hosts}, sort_keys=False)


def write(layout: LabLayout, slots: list[HostSlot], access: dict[str, dict] | None = None) -> Path:
    layout.inventory.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(layout.inventory, render(layout, slots, access), 0o644)
    return layout.inventory


def remove(layout: LabLayout) -> None:
    """Only an inventory this lab wrote (never a hand-written one at the same path)."""
    path = layout.inventory
    if path.is_file() and path.read_text().startswith(HEADER.format(state=layout.state_dir)):
        path.unlink()

