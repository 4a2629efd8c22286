"""Lab hosts reached the way real fleets are: a non-root `ops` user with sudo, behind a bastion.

`lab up --ops` gives every host (and the bastion) a user `ops` logging in with the lab's client
key, whose sudo asks for a password (random per lab, in the state dir, 0600): the inventory says
`ssh_user: ops`, `become: sudo`, `become_password_file`. `lab up --bastion` (implies --ops) boots
bare-1 as a bastion and lets `ops` into the lab hosts only from the bastion's address (sshd
AllowUsers), so they are reachable only by ProxyJump; the inventory names each host by a Host
alias of the lab's own ssh_config (HostName, User, IdentityFile, ProxyJump bastion). The lab's
root key still reaches every host directly: `lab up` itself maintains them that way.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass
from pathlib import Path

from ddops import systemd
from ddops.lab.keys import write_atomic
from ddops.lab.layout import HostSlot, LabLayout

OPS = "ops"
BASTION = "bare-1"
SUDOERS = "ops ALL=(ALL:ALL) ALL\n"


@dataclass(frozen=True)
class Access:
    ops: bool = False
    bastion: bool = False

    @classmethod
    def load(cls, layout: LabLayout, ops: bool, bastion: bool) -> "Access":
        """Flags given now, or those the lab was first brought up with (kept in the state dir)."""
        path = layout.state_dir / "access.json"
        if not (ops or bastion) and path.is_file():
            return cls(**json.loads(path.read_text()))
        access = cls(ops=ops or bastion, bastion=bastion)
        write_atomic(path, json.dumps(access.__dict__), 0o600)
        return access


def password_file(layout: LabLayout) -> Path:
    path = layout.state_dir / "ops-sudo-password"
    if not path.is_file():
        write_atomic(path, secrets.token_urlsafe(18) + "\n", 0o600)
    return path


def setup_ops(remote, layout: LabLayout) -> None:
    """Create `ops` (key login, sudo with the lab's password) on one host, as root."""
    pub = layout.client_key.with_suffix(".pub").read_text()
    remote.run(f"id -u {OPS} >/dev/null 2>&1 || useradd -m -s /bin/sh {OPS}")
    remote.write(f"/home/{OPS}/.ssh/authorized_keys", pub, mode=0o600, owner=f"{OPS}:{OPS}")
    remote.run(f"chown {OPS}:{OPS} /home/{OPS}/.ssh && chmod 700 /home/{OPS}/.ssh")
    password = password_file(layout).read_text().strip()
    remote.write("/root/.ddops-ops-chpasswd", f"{OPS}:{password}\n", mode=0o600)
    remote.run("chpasswd < /root/.ddops-ops-chpasswd; status=$?; rm -f /root/.ddops-ops-chpasswd; exit $status")
    remote.write("/etc/sudoers.d/ddops-ops", SUDOERS, mode=0o440)
    remote.run("visudo -cq -f /etc/sudoers.d/ddops-ops")


def only_through(remote, bastion: HostSlot, layout: LabLayout) -> None:
    """ops may log in only from the bastion; root only from this machine (the lab's own upkeep)."""
    rule = f"AllowUsers {OPS}@{bastion.address} root@{layout.gateway}\n"
    remote.write("/etc/ssh/sshd_config.d/ddops-bastion.conf", rule)
    remote.run(f"sshd -t && {systemd.reload('ssh')}")


def ssh_config(layout: LabLayout, slots: list[HostSlot], bastion: HostSlot | None) -> Path:
    """One Host alias per lab host (and the bastion), written to the state dir."""
    key = layout.client_key
    blocks = []
    if bastion:
        blocks.append(f"Host {BASTION}\n  HostName {bastion.address}\n  User {OPS}\n  IdentityFile {key}\n")
    for slot in slots:
        jump = f"  ProxyJump {BASTION}\n" if bastion else ""
        blocks.append(f"Host {slot.name}\n  HostName {slot.address}\n  User {OPS}\n  IdentityFile {key}\n{jump}")
    path = layout.state_dir / "ssh_config"
    write_atomic(path, "\n".join(blocks), 0o644)
    return path


def inventory_entry(layout: LabLayout, slot: HostSlot, config: Path) -> dict:
    """The inventory fields of a host reached as ops (its address is the ssh_config alias)."""
    return {"address": slot.name, "ssh_config": str(config), "known_hosts": str(layout.known_hosts),
            "become": "sudo", "become_password_file": str(password_file(layout))}
