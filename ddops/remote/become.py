"""Running as root on a host reached as another user, like Ansible's `become: sudo`.

Every remote action of ddops (commands, file writes, systemctl, journalctl, the lock's flock)
goes through `Become.wrap`. Passwordless sudo runs `sudo -n`; with a password (from the env var
or file the inventory names) it runs `sudo -S -p ''` and the password reaches sudo only on stdin,
never in argv or a log. Whether sudo reads that line depends on its own state (NOPASSWD rules,
cached credentials), so a random marker line follows the password and the wrapped command skips
stdin up to it: what the command itself reads from stdin (the lock's `release`) stays intact.
"""

from __future__ import annotations

import os
import shlex
import time
import uuid
from dataclasses import dataclass
from pathlib import Path


class BecomeError(Exception):
    """The become settings cannot be used (password env var unset, file unreadable)."""


@dataclass(frozen=True)
class Become:
    method: str | None          # None: the SSH user is root, commands run as they are
    password: str | None = None

    @property
    def active(self) -> bool:
        return self.method is not None

    def wrap(self, command: str) -> tuple[str, bytes]:
        """(command line for the SSH channel, bytes to write to its stdin first)."""
        if not self.active:
            return command, b""
        if self.password is None:
            return f"sudo -n -- sh -c {shlex.quote(command)}", b""
        marker = f"ddops-stdin-{uuid.uuid4().hex}"
        skip = f'while IFS= read -r _l; do [ "$_l" = {marker} ] && break; done; '
        return (f"sudo -S -p '' -- sh -c {shlex.quote(skip + command)}",
                f"{self.password}\n{marker}\n".encode())


def become_of(host) -> Become:
    """The host's become settings with the password resolved on this machine (BecomeError if unusable)."""
    if not host.become:
        return Become(None)
    if host.become_password_env:
        value = os.environ.get(host.become_password_env)
        if value is None:
            raise BecomeError(f"{host.name}: become_password_env {host.become_password_env} is not set")
        return Become(host.become, value)
    if host.become_password_file:
        try:
            return Become(host.become, Path(host.become_password_file).read_text().rstrip("\n"))
        except OSError as exc:
            raise BecomeError(f"{host.name}: become_password_file {host.become_password_file}: "
                              f"{exc.strerror}") from None
    return Become(host.become)


def run_channel(transport, command: str, stdin: bytes, timeout: float | None, sink=None) -> tuple[int, str, str]:
    """Run command on a fresh session channel: (exit status, stdout, stderr); exit -1 when the
    channel closed without one. sink(bytes) receives stdout as it arrives (streaming)."""
    chan = transport.open_session()
    try:
        chan.exec_command(command)
        if stdin:
            chan.sendall(stdin)
        chan.shutdown_write()       # the command sees EOF after what we sent, as with `ssh host cmd </dev/null`
        return collect(chan, timeout, sink)
    finally:
        chan.close()


def collect(chan, timeout: float | None = None, sink=None) -> tuple[int, str, str]:
    """Read a running channel to its end: (exit status, stdout, stderr); -1 without a status."""
    deadline = time.monotonic() + timeout if timeout else None
    out, err = bytearray(), bytearray()
    while True:
        if chan.recv_ready():
            data = chan.recv(65536)
            out += data
            if sink:
                sink(data)
        elif chan.recv_stderr_ready():
            err += chan.recv_stderr(65536)
        elif chan.exit_status_ready() or chan.closed or not chan.get_transport().is_active():
            break
        elif deadline and time.monotonic() > deadline:
            raise TimeoutError(f"still running after {timeout} s")
        else:
            time.sleep(0.005)
    status = chan.recv_exit_status() if chan.exit_status_ready() else -1
    while chan.recv_ready():
        out += chan.recv(65536)
    while chan.recv_stderr_ready():
        err += chan.recv_stderr(65536)
    return status, out.decode(errors="replace"), err.decode(errors="replace")
