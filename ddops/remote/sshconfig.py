"""Where and how to reach a host: the inventory entry merged with OpenSSH client config.

The inventory's `address` may be a Host alias of the SSH config (`ssh_config` in the inventory,
else ~/.ssh/config): HostName, Port, User, IdentityFile and ProxyJump come from there, and what
the inventory states explicitly wins. A ProxyJump host is resolved the same way (one hop).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import paramiko


@dataclass(frozen=True)
class Endpoint:
    hostname: str
    port: int
    user: str
    keys: tuple[str, ...]       # identity files; empty: the agent and the default keys
    jump: "Endpoint | None" = None

    @property
    def label(self) -> str:
        via = f" via {self.jump.user}@{self.jump.hostname}:{self.jump.port}" if self.jump else ""
        return f"{self.user}@{self.hostname}:{self.port}{via}"


def config_path(host) -> Path | None:
    if host.ssh_config:
        return Path(host.ssh_config)
    default = Path(os.path.expanduser("~/.ssh/config"))
    return default if default.is_file() else None


def load_config(path: Path | None) -> paramiko.SSHConfig:
    if path is None:
        return paramiko.SSHConfig()
    return paramiko.SSHConfig.from_path(str(path))


def endpoint(host) -> Endpoint:
    """Raises OSError when the named ssh_config cannot be read."""
    config = load_config(config_path(host))
    stated = host.model_fields_set
    explicit = {"user": host.ssh_user if "ssh_user" in stated else None,
                "port": host.ssh_port if "ssh_port" in stated else None,
                "keys": (str(host.ssh_key),) if host.ssh_key else None}
    return _resolve(config, host.address, explicit, hops=1)


def behind_ssh(host, where: Endpoint | None = None) -> bool:
    """Whether the host's services cannot be dialed at its inventory address from here: it is
    reached through a jump host, or its address is an ssh_config alias of another HostName.
    where: the host's endpoint when already resolved."""
    where = where or endpoint(host)
    return where.jump is not None or where.hostname != host.address


def _resolve(config: paramiko.SSHConfig, alias: str, explicit: dict, hops: int) -> Endpoint:
    found = config.lookup(alias)
    keys = explicit["keys"] or tuple(os.path.expanduser(k) for k in found.get("identityfile", []))
    jump = None
    if found.get("proxyjump") and found["proxyjump"].lower() != "none" and hops > 0:
        jump = _resolve(config, *_jump_target(found["proxyjump"]), hops=hops - 1)
    return Endpoint(found.get("hostname", alias), int(explicit["port"] or found.get("port", 22)),
                    explicit["user"] or found.get("user", "root"), keys, jump)


def _jump_target(spec: str) -> tuple[str, dict]:
    """`[user@]host[:port]` (the first of a comma list) -> (alias, what it states explicitly)."""
    first = spec.split(",")[0].strip()
    user, _, rest = first.rpartition("@")
    name, _, port = rest.partition(":")
    return name, {"user": user or None, "port": int(port) if port else None, "keys": None}
