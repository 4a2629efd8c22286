"""Opening a verified connection: ssh config, ProxyJump, keys and agent, host keys, become.

Host keys are always checked (RejectPolicy) against the host's known_hosts from the inventory
(lab hosts: the file `ddops lab up` writes), or the user's ~/.ssh/known_hosts when the inventory
names none; a jump host's key is checked against the same file. `host_key` reads what a host
presents without trusting it, for `ddops hosts trust`.
"""

from __future__ import annotations

import base64
import hashlib
import os
import socket

import fabric
import paramiko

from ddops.remote.become import BecomeError, become_of
from ddops.remote.session import BadSetup, Remote, Unreachable
from ddops.remote.sshconfig import Endpoint, endpoint


# AES-GCM first: one AEAD call per packet instead of AES-CTR plus a separate HMAC, which costs
# paramiko ~25% of its CPU per byte sent (ddops.lab.bench_push measures it). The rest of
# paramiko's list follows, so a server without GCM still negotiates.
FAST_CIPHERS = ("aes128-gcm@openssh.com", "aes256-gcm@openssh.com")


def connect(host, connect_timeout: float = 15, ciphers: tuple[str, ...] = FAST_CIPHERS) -> Remote:
    """Open a host-key-verified connection to host. Unreachable (one line) when the host cannot be
    reached or refuses us, BadSetup when this machine's side is missing (keys, known_hosts, become).
    ciphers: offered before paramiko's own order (which follows them)."""
    where, become = setup(host)
    gateway = _connection(where.jump, host, connect_timeout, ciphers=ciphers) if where.jump else None
    connection = _connection(where, host, connect_timeout, gateway, ciphers)
    remote = Remote(host, connection, become)
    remote.endpoint = where
    try:
        open_or_close(connection)
    except paramiko.BadHostKeyException:
        raise Unreachable(f"{remote.label}: host key does not match {known_hosts_of(host)}; refusing to connect "
                          "(if the host was re-created, run `ddops lab up` again or `ddops hosts trust`)") from None
    except paramiko.AuthenticationException as exc:
        keys = ", ".join(where.keys) or "agent and default keys"
        raise Unreachable(f"{remote.label}: {keys} refused for {where.label}: {exc}") from None
    except paramiko.SSHException as exc:
        raise Unreachable(f"{remote.label}: {exc} ({where.label}; known_hosts: {known_hosts_of(host)}; "
                          f"`ddops hosts trust {host.name}` records a new host's key)") from None
    except (OSError, socket.timeout, EOFError) as exc:
        raise Unreachable(f"{remote.label}: cannot connect to port {where.port} ({where.label}): {exc}") from None
    return remote


def setup(host) -> tuple[Endpoint, object]:
    """What this machine needs to connect to host (its endpoint and become settings), checked
    without touching the network: BadSetup (bad input) when a key, known_hosts or become is missing."""
    label = f"{host.name} ({host.address})"
    try:
        where = endpoint(host)
        become = become_of(host)
    except (OSError, BecomeError) as exc:
        raise BadSetup(f"{label}: {exc}") from None
    for key in where.keys:
        if not os.path.isfile(key):
            raise BadSetup(f"{label}: ssh key {key}: no such file")
    if host.known_hosts and not os.path.isfile(host.known_hosts):
        raise BadSetup(f"{label}: known_hosts {host.known_hosts}: no such file (lab hosts: run `ddops lab up`)")
    return where, become


def _connection(where: Endpoint, host, timeout: float, gateway=None,
                ciphers: tuple[str, ...] = FAST_CIPHERS) -> fabric.Connection:
    # key_filename=None makes Fabric fail (it extends a list with it): pass it only when set.
    # The agent is always offered alongside the keys, as OpenSSH does.
    kwargs = {"look_for_keys": not where.keys, "allow_agent": True, "transport_factory": preferring(ciphers),
              **({"key_filename": list(where.keys)} if where.keys else {})}
    connection = fabric.Connection(
        where.hostname, user=where.user, port=where.port, connect_timeout=timeout, gateway=gateway,
        config=fabric.Config(ssh_config=paramiko.SSHConfig()),   # resolved already (sshconfig.py)
        connect_kwargs=kwargs)
    trust(connection.client, host)
    return connection


def preferring(ciphers: tuple[str, ...]):
    """A paramiko Transport factory that offers ciphers first, then paramiko's default order."""
    def transport(sock, **kwargs) -> paramiko.Transport:
        made = paramiko.Transport(sock, **kwargs)
        options = made.get_security_options()
        known = set(options.ciphers)
        options.ciphers = tuple(c for c in ciphers if c in known) + tuple(c for c in options.ciphers if c not in ciphers)
        return made
    return transport


def open_or_close(connection: fabric.Connection) -> None:
    try:
        connection.open()
    except BaseException:
        connection.close()
        raise


def known_hosts_of(host) -> str:
    return str(host.known_hosts) if host.known_hosts else os.path.expanduser("~/.ssh/known_hosts")


def trust(client: paramiko.SSHClient, host) -> None:
    """Only keys already in known_hosts are accepted; Fabric's default would add unknown ones."""
    path = known_hosts_of(host)
    if os.path.exists(path):
        client.load_host_keys(path)
    client.set_missing_host_key_policy(paramiko.RejectPolicy())


def host_key(host, timeout: float = 15) -> tuple[str, str, str]:
    """(known_hosts name, key type, base64 key) the host presents, read without authenticating;
    Unreachable when it presents none. A jump host must already be trusted (the key is read through it)."""
    where = endpoint(host)
    try:
        if where.jump:
            gateway = _connection(where.jump, host, timeout)
            open_or_close(gateway)
            sock = gateway.transport.open_channel("direct-tcpip", (where.hostname, where.port), ("", 0))
        else:
            sock = socket.create_connection((where.hostname, where.port), timeout=timeout)
        transport = paramiko.Transport(sock)
        try:
            transport.start_client(timeout=timeout)
            key = transport.get_remote_server_key()
        finally:
            transport.close()
    except (paramiko.SSHException, OSError, EOFError) as exc:
        raise Unreachable(f"{host.name} ({host.address}): cannot read its host key on port {where.port} "
                          f"({where.label}): {exc or type(exc).__name__}") from None
    name = where.hostname if where.port == 22 else f"[{where.hostname}]:{where.port}"
    return name, key.get_name(), key.get_base64()


def recorded_keys(path: str, name: str) -> set[tuple[str, str]]:
    """(key type, base64 key) pairs the known_hosts file at path holds for name, the way the
    connection reads it: plain and hashed (`|1|salt|hash`, `ssh-keygen -H`) entries alike."""
    if not os.path.isfile(path):
        return set()
    entries = paramiko.HostKeys(path).lookup(name) or {}
    return {(key_type, key.get_base64()) for key_type, key in entries.items()}


def fingerprint(key_b64: str) -> str:
    """OpenSSH's SHA256 fingerprint of a base64 public key."""
    digest = hashlib.sha256(base64.b64decode(key_b64)).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")
