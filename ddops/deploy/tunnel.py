"""Reach a service through the deploy's own SSH connection when this machine cannot reach it
directly: one that listens on the host's loopback only (SGLang's default bind), or any service
of a host reached through a jump host or by an ssh_config alias (`remote.behind_ssh`: its address
is not one to dial). A local listener on 127.0.0.1 carries each connection as a direct-tcpip
channel to the port on the host. `reachable` uses a connection the caller holds (the gate,
`ddops status`); `dialable` opens one only when the URL needs it (through rollout/host_changes.py:
shadow compare and the rollout's bake). `needs_tunnel` decides for both."""

from __future__ import annotations

import contextlib
import select
import socket
import threading
from typing import Iterator
from urllib.parse import urlsplit

from ddops.remote import connect
from ddops.remote.sshconfig import behind_ssh

LOOPBACK = ("127.0.0.1", "localhost", "::1")


def is_loopback(base_url: str) -> bool:
    return (urlsplit(base_url).hostname or "") in LOOPBACK or \
        (urlsplit(base_url).hostname or "").startswith("127.")


def needs_tunnel(base_url: str, host_behind_ssh: bool) -> bool:
    """The service listens on the host's loopback, or the host is reached only through SSH."""
    return is_loopback(base_url) or host_behind_ssh


@contextlib.contextmanager
def reachable(remote, base_url: str) -> Iterator[str]:
    """base_url itself when the service listens on an address we can reach, else a tunnel URL."""
    parts = urlsplit(base_url)
    target = parts.hostname
    if not needs_tunnel(base_url, getattr(remote, "behind_ssh", False)):
        yield base_url
        return
    if target == remote.host.address:     # a service bound to every address: the host's loopback
        target = "127.0.0.1"
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    stop = threading.Event()
    transport = remote.connection.transport
    thread = threading.Thread(target=_accept, args=(listener, transport, target, parts.port or 80, stop),
                              daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        stop.set()
        listener.close()


@contextlib.contextmanager
def dialable(host, url: str) -> Iterator[str]:
    """url itself when this machine can dial it; else, while the context lasts, a local URL
    tunnelled through an SSH connection to host opened here. Unreachable when the host cannot
    be reached. A host at 127.0.0.1 is this machine: its loopback URLs are dialed as they are."""
    this_machine = is_loopback(url) and is_loopback(f"http://{host.address}")
    if this_machine or not needs_tunnel(url, behind_ssh(host)):
        yield url
        return
    with connect(host) as remote, reachable(remote, url) as local:
        yield local


def _accept(listener, transport, host: str, port: int, stop: threading.Event) -> None:
    while not stop.is_set():
        try:
            client, peer = listener.accept()
        except OSError:
            return
        try:
            channel = transport.open_channel("direct-tcpip", (host, port), peer)
        except Exception:  # noqa: BLE001 - refused on the host: the client sees a closed socket
            client.close()
            continue
        threading.Thread(target=_pump, args=(client, channel), daemon=True).start()


def _pump(client: socket.socket, channel) -> None:
    """Copy bytes both ways until either side closes."""
    try:
        while True:
            ready, _, _ = select.select([client, channel], [], [], 30)
            if client in ready:
                data = client.recv(65536)
                if not data:
                    break
                channel.sendall(data)
            if channel in ready:
                data = channel.recv(65536)
                if not data:
                    break
                client.sendall(data)
    except OSError:
        pass
    finally:
        channel.close()
        client.close()
