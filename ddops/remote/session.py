"""One open SSH connection to one host: run commands, read and write files, as root.

On a host whose SSH user is not root (inventory `become: sudo`) every command is wrapped by
become.Become and file reads/writes go through commands too: a write uploads to a private
temporary file of the SSH user, then `install -m MODE -o OWNER` puts it next to the target
and `mv` renames it into place, so a killed push never leaves a half-written file and a secret
never sits in a file readable by others.
"""

from __future__ import annotations

import logging
import posixpath
import shlex
import sys
import time
import uuid
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import fabric
import invoke
import paramiko

from ddops import exits
from ddops.remote import framing, sshconfig
from ddops.remote.become import Become, run_channel

LOST = (paramiko.SSHException, OSError, EOFError)
q = shlex.quote
log = logging.getLogger("ddops.remote")     # `ddops --debug` prints it (ddops.cli)


class RemoteError(Exception):
    """An SSH operation failed; one line naming the host, what was attempted and why. Raised as
    one of the four causes below, each an exits cause of its own."""


class BadSetup(RemoteError, exits.BadInput):
    """This machine's side cannot connect: an ssh key or known_hosts file missing, become unusable."""


class Unreachable(RemoteError, exits.Unreachable):
    """The connection could not be opened: no route, refused, host key, login. Nothing ran."""


class ConnectionLost(RemoteError, exits.ConnectionLost):
    """The connection dropped after it opened (a command in flight may have run or not)."""


class CommandFailed(RemoteError, exits.HostFailed):
    """A command exited non-zero (`result` holds it) or ran past its time (`result` is None), or a
    file operation failed, on a connection that is still up."""

    def __init__(self, message: str, result: "Result | None" = None):
        super().__init__(message)
        self.result = result


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
    def __init__(self, host, connection: fabric.Connection, become: Become | None = None):
        self.host = host
        self.connection = connection
        self.become = become or Become(None)
        self.endpoint = None     # sshconfig.Endpoint: where the connection really goes
        self.cache: dict = {}    # per-connection memo (e.g. the runtime's --help)
        self.lock = None         # the host lock this connection holds (deploy/lock.py): nested changes join it
        # what this connection cost: commands (one exec channel each) and SFTP file operations
        # (several requests each), logged when it closes
        self.trips: Counter = Counter()
        self.opened = time.monotonic()

    @property
    def behind_ssh(self) -> bool:
        """The host's HTTP services are reached through this connection: it sits behind a jump
        host, or its inventory address is an ssh_config alias this machine cannot dial."""
        return self.endpoint is not None and sshconfig.behind_ssh(self.host, self.endpoint)

    @property
    def label(self) -> str:
        return f"{self.host.name} ({self.host.address})"

    def run(self, command: str, check: bool = True, timeout: float | None = None,
            stream: bool = False) -> Result:
        """Run a shell command as root; check=True raises RemoteError on a non-zero exit, naming its
        stderr. A connection lost meanwhile always raises RemoteError. stream=True prints stdout as it comes."""
        self.trips["commands"] += 1
        try:
            status, out, err = self._execute(command, timeout, stream)
        except (invoke.CommandTimedOut, TimeoutError):
            raise CommandFailed(f"{self.label}: `{short(command)}` still running after {timeout} s") from None
        except LOST as exc:
            raise ConnectionLost(f"{self.label}: `{short(command)}`: connection lost: {exc}") from None
        if status == -1 and not self.alive():    # the channel closed without an exit status
            raise ConnectionLost(f"{self.label}: `{short(command)}`: connection lost")
        result = Result(command, status, out, err)
        if check and not result.ok:
            reason = last_line(result.stderr) or last_line(result.stdout) or "(no output)"
            raise CommandFailed(f"{self.label}: `{short(command)}` exited {result.exit_code}: {reason}", result)
        return result

    def _execute(self, command: str, timeout: float | None, stream: bool) -> tuple[int, str, str]:
        if not self.become.active:
            out = self.connection.run(command, hide=not stream, warn=True, in_stream=False, timeout=timeout)
            return out.exited, out.stdout, out.stderr
        wrapped, stdin = self.become.wrap(command)
        sink = (lambda data: (sys.stdout.buffer.write(data), sys.stdout.flush())) if stream else None
        return run_channel(self.connection.transport, wrapped, stdin, timeout, sink)

    def open_channel(self, command: str) -> paramiko.Channel:
        """A session channel running command as root, its stdin left open for the caller."""
        wrapped, stdin = self.become.wrap(command)
        self.trips["commands"] += 1
        try:
            self.connection.open()
            chan = self.connection.transport.open_session()
            chan.exec_command(wrapped)
            if stdin:
                chan.sendall(stdin)
        except LOST as exc:
            raise self.failed(f"`{short(command)}`", exc) from None
        return chan

    def read(self, path: str) -> bytes | None:
        """The file's bytes, or None when it does not exist."""
        if self.become.active:
            return framing.ask(self, framing.file("file", path))["file"]
        self.trips["file reads"] += 1
        try:
            with self.sftp().open(path, "rb") as handle:
                return handle.read()
        except FileNotFoundError:
            return None
        except LOST as exc:
            raise self.failed(f"read {path}", exc) from None

    def read_all(self, *paths: str) -> list[bytes | None]:
        """Several files in one round trip: each one's bytes, or None where it does not exist."""
        answers = framing.ask(self, *(framing.file(str(i), p) for i, p in enumerate(paths)))
        return [answers[str(i)] for i in range(len(paths))]

    def read_text(self, path: str) -> str | None:
        data = self.read(path)
        return None if data is None else data.decode()

    def exists(self, path: str) -> bool:
        if self.become.active:
            return self.run(f"test -e {q(path)}", check=False).ok
        self.trips["file stats"] += 1
        try:
            self.sftp().stat(path)
            return True
        except FileNotFoundError:
            return False
        except LOST as exc:
            raise self.failed(f"stat {path}", exc) from None

    def write(self, path: str, data: bytes | str, mode: int = 0o644, owner: str | None = None) -> None:
        """Replace path atomically with data (parent directories are created); owner: user[:group]."""
        payload = data.encode() if isinstance(data, str) else data
        self._place(path, mode, owner, lambda handle: handle.write(payload))

    def put(self, local: Path, path: str, mode: int = 0o644, owner: str | None = None) -> None:
        """Upload a local file to path atomically (parent directories are created)."""
        def upload(handle) -> None:
            with open(local, "rb") as src:
                while chunk := src.read(1 << 20):
                    handle.write(chunk)
        self._place(path, mode, owner, upload)

    def mkdir(self, path: str, mode: int = 0o755) -> None:
        self.run(f"mkdir -p -m {mode:o} {q(path)}")

    def _place(self, path: str, mode: int, owner: str | None, upload) -> None:
        """Write to a temporary name beside path, then rename it into place. The parent is made
        only when it is missing (a command costs a round trip; most writes go to folders that exist)."""
        parent, name = posixpath.split(path)
        tmp = posixpath.join(parent, f".{name}.ddops-tmp-{uuid.uuid4().hex[:8]}")
        self.trips["file writes"] += 1
        if self.become.active:
            return self._place_as_root(path, tmp, mode, owner, upload)
        sftp = self.sftp()
        try:
            try:
                handle = sftp.open(tmp, "wb")
            except FileNotFoundError:
                self.mkdir(parent or "/")
                handle = sftp.open(tmp, "wb")
            with handle:
                handle.chmod(mode)      # mode first, content second: a secret never sits in a file readable by others
                upload(handle)
            if owner:
                self.run(f"chown {q(owner)} {q(tmp)}")
            sftp.posix_rename(tmp, path)
        except LOST as exc:
            try:
                sftp.remove(tmp)
            except LOST:
                pass
            raise self.failed(f"write {path}", exc) from None

    def _place_as_root(self, path: str, tmp: str, mode: int, owner: str | None, upload) -> None:
        staged = f"/tmp/.ddops-upload-{uuid.uuid4().hex}"     # the SSH user's own file, 0600
        try:
            with self.sftp().open(staged, "wb") as handle:
                handle.chmod(0o600)
                upload(handle)
        except LOST as exc:
            raise self.failed(f"upload for {path}", exc) from None
        user, _, group = (owner or "root").partition(":")
        parent = posixpath.dirname(path) or "/"
        self.run(f"mkdir -p -m 755 {q(parent)} && install -m {mode:o} -o {q(user)} -g {q(group or user)} "
                 f"{q(staged)} {q(tmp)} && mv -f {q(tmp)} {q(path)}; status=$?; rm -f {q(staged)} {q(tmp)}; "
                 "exit $status")

    def lost(self, exc: BaseException, settle_s: float = 2.0) -> bool:
        """Whether exc means this connection is gone: a ConnectionLost, or a socket/SSH error raised
        by a channel of a transport that is no longer active; never a command that exited non-zero
        (CommandFailed). A channel may see its socket closed a moment before the transport's
        reader thread marks the transport inactive: wait for it."""
        if isinstance(exc, RemoteError):
            return isinstance(exc, ConnectionLost)
        if not isinstance(exc, LOST):
            return False
        deadline = time.monotonic() + settle_s
        while self.alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        return not self.alive()

    def failed(self, what: str, exc: BaseException) -> RemoteError:
        """The error for a socket/SFTP error while doing `what`: ConnectionLost when the connection
        went with it, else CommandFailed (a permission denied, a full disk)."""
        if self.lost(exc):
            return ConnectionLost(f"{self.label}: {what}: connection lost: {exc or type(exc).__name__}")
        return CommandFailed(f"{self.label}: {what}: {exc or type(exc).__name__}")

    def alive(self) -> bool:
        transport = self.connection.client.get_transport()
        return transport is not None and transport.is_active()

    def sftp(self) -> paramiko.SFTPClient:
        try:
            return self.connection.sftp()
        except LOST as exc:
            raise self.failed("sftp", exc) from None

    def close(self) -> None:
        if self.trips:
            spent = ", ".join(f"{count} {kind}" for kind, count in sorted(self.trips.items()))
            log.debug("%s: %s over %.1f s", self.label, spent, time.monotonic() - self.opened)
            self.trips.clear()
        self.connection.close()

    def __enter__(self) -> Remote:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def short(command: str) -> str:
    return command if len(command) <= 80 else command[:77] + "..."


def last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else ""
