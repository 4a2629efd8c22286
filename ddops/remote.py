"""The SSH boundary: the only module that imports Fabric (and paramiko).

`connect(host)` opens one verified connection and wraps it in a `Remote`; everything else takes
a Remote as an argument. Host keys are always checked (RejectPolicy) against the host's
known_hosts from the inventory (lab hosts: the file `ddops lab up` writes), or the user's
~/.ssh/known_hosts when the inventory names none. Files are written to a temporary name in the
target directory and renamed into place, so a killed push never leaves a half-written file.
"""

from __future__ import annotations

import io
import os
import posixpath
import shlex
import socket
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import fabric
import invoke
import paramiko

if TYPE_CHECKING:
    from ddops.inventory import Host


class RemoteError(Exception):
    """An SSH operation failed; one line naming the host, what was attempted and why."""


@dataclass(frozen=True)
class Result:
    command: str
    exit_code: int
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        return self.exit_code == 0


class Remote:
    """One open SSH connection to one host: run commands, read and write files."""

    def __init__(self, host: Host, connection: fabric.Connection):
        self.host = host
        self.connection = connection
        self.cache: dict = {}    # per-connection memo (e.g. the runtime's --help)

    @property
    def label(self) -> str:
        return f"{self.host.name} ({self.host.address})"

    def run(self, command: str, check: bool = True, timeout: float | None = None,
            stream: bool = False) -> Result:
        """Run a shell command; check=True raises RemoteError on a non-zero exit, naming its stderr.
        A connection lost meanwhile always raises RemoteError. stream=True prints the output as it comes."""
        try:
            out = self.connection.run(command, hide=not stream, warn=True, in_stream=False, timeout=timeout)
        except invoke.CommandTimedOut:
            raise RemoteError(f"{self.label}: `{short(command)}` still running after {timeout} s") from None
        except (paramiko.SSHException, OSError, EOFError) as exc:
            raise RemoteError(f"{self.label}: `{short(command)}`: connection lost: {exc}") from None
        if out.exited == -1 and not self.alive():    # the channel closed without an exit status
            raise RemoteError(f"{self.label}: `{short(command)}`: connection lost")
        result = Result(command, out.exited, out.stdout, out.stderr)
        if check and not result.ok:
            reason = last_line(result.stderr) or last_line(result.stdout) or "(no output)"
            raise RemoteError(f"{self.label}: `{short(command)}` exited {result.exit_code}: {reason}")
        return result

    def read(self, path: str) -> bytes | None:
        """The file's bytes, or None when it does not exist."""
        try:
            with self.sftp().open(path, "rb") as handle:
                return handle.read()
        except FileNotFoundError:
            return None
        except (OSError, EOFError, paramiko.SSHException) as exc:
            raise RemoteError(f"{self.label}: read {path}: {exc or 'connection lost'}") from None

    def read_text(self, path: str) -> str | None:
        data = self.read(path)
        return None if data is None else data.decode()

    def exists(self, path: str) -> bool:
        try:
            self.sftp().stat(path)
            return True
        except FileNotFoundError:
            return False
        except (OSError, EOFError, paramiko.SSHException) as exc:
            raise RemoteError(f"{self.label}: stat {path}: {exc or 'connection lost'}") from None

    def write(self, path: str, data: bytes | str, mode: int = 0o644) -> None:
        """Replace path atomically with data (parent directories are created)."""
        payload = data.encode() if isinstance(data, str) else data
        self._place(path, mode, lambda sftp, tmp: sftp.putfo(io.BytesIO(payload), tmp, confirm=True))

    def put(self, local: Path, path: str, mode: int = 0o644) -> None:
        """Upload a local file to path atomically (parent directories are created)."""
        self._place(path, mode, lambda sftp, tmp: sftp.put(str(local), tmp, confirm=True))

    def mkdir(self, path: str, mode: int = 0o755) -> None:
        self.run(f"mkdir -p -m {mode:o} {shlex.quote(path)}")

    def _place(self, path: str, mode: int, upload) -> None:
        parent, name = posixpath.split(path)
        tmp = posixpath.join(parent, f".{name}.ddops-tmp-{uuid.uuid4().hex[:8]}")
        self.mkdir(parent or "/")
        sftp = self.sftp()
        try:
            # Mode first, content second: a secret never sits in a file readable by others.
            sftp.open(tmp, "wb").close()
            sftp.chmod(tmp, mode)
            upload(sftp, tmp)
            sftp.posix_rename(tmp, path)
        except (OSError, EOFError, paramiko.SSHException) as exc:
            try:
                sftp.remove(tmp)
            except (OSError, EOFError, paramiko.SSHException):
                pass
            raise RemoteError(f"{self.label}: write {path}: {exc}") from None

    def alive(self) -> bool:
        transport = self.connection.client.get_transport()
        return transport is not None and transport.is_active()

    def sftp(self) -> paramiko.SFTPClient:
        try:
            return self.connection.sftp()
        except (OSError, EOFError, paramiko.SSHException) as exc:
            raise RemoteError(f"{self.label}: sftp: connection lost: {exc}") from None

    def close(self) -> None:
        self.connection.close()

    def __enter__(self) -> Remote:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def connect(host: Host, connect_timeout: float = 15) -> Remote:
    """Open a host-key-verified connection to host; RemoteError (one line) when that is not possible."""
    key = str(host.ssh_key) if host.ssh_key else None
    label = f"{host.name} ({host.address})"
    if key and not os.path.isfile(key):
        raise RemoteError(f"{label}: ssh_key {key}: no such file")
    if host.known_hosts and not os.path.isfile(host.known_hosts):
        raise RemoteError(f"{label}: known_hosts {host.known_hosts}: no such file (lab hosts: run `ddops lab up`)")
    connection = fabric.Connection(
        host.address, user=host.ssh_user, port=host.ssh_port, connect_timeout=connect_timeout,
        config=fabric.Config(ssh_config=paramiko.SSHConfig()),   # no ~/.ssh/config surprises
        # key_filename=None makes Fabric fail (it extends a list with it): pass it only when set
        connect_kwargs={"look_for_keys": key is None, "allow_agent": key is None,
                        **({"key_filename": key} if key else {})})
    trust(connection.client, host)
    remote = Remote(host, connection)
    try:
        open_or_close(connection)
    except paramiko.BadHostKeyException:
        raise RemoteError(f"{remote.label}: host key does not match {known_hosts_of(host)}; refusing to connect "
                          "(if the host was re-created, run `ddops lab up` again or update known_hosts)") from None
    except paramiko.AuthenticationException as exc:
        raise RemoteError(f"{remote.label}: key {key or '(default keys)'} refused for user {host.ssh_user}: {exc}") from None
    except paramiko.SSHException as exc:
        raise RemoteError(f"{remote.label}: {exc} (known_hosts: {known_hosts_of(host)})") from None
    except (OSError, socket.timeout, EOFError) as exc:
        raise RemoteError(f"{remote.label}: cannot connect to port {host.ssh_port}: {exc}") from None
    return remote


def open_or_close(connection: fabric.Connection) -> None:
    try:
        connection.open()
    except BaseException:
        connection.close()
        raise


def known_hosts_of(host: Host) -> str:
    return str(host.known_hosts) if host.known_hosts else os.path.expanduser("~/.ssh/known_hosts")


def trust(client: paramiko.SSHClient, host: Host) -> None:
    """Only keys already in known_hosts are accepted; Fabric's default would add unknown ones."""
    path = known_hosts_of(host)
    if os.path.exists(path):
        client.load_host_keys(path)
    client.set_missing_host_key_policy(paramiko.RejectPolicy())


def short(command: str) -> str:
    return command if len(command) <= 80 else command[:77] + "..."


def last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else ""
