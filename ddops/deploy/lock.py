"""The per-host deploy lock.

A `flock` on the host, held by a command that lives as long as our SSH channel: if the
deploy is killed, sshd closes the channel, the command reads EOF and the kernel drops the
lock. The holder's details sit in holder.json while it holds the lock, so a refused deploy
names who holds it; a holder.json found by the next taker means the previous holder died
without releasing (a killed deploy), which the taker reports as a recovered stale lock.

A holder killed while its link was down leaves the host's end of the channel open until sshd
notices (TCP keepalive: hours). The next taker on the same machine sees the holder's pid is
gone from it and releases that lock itself: it stops the host's lock command (holder.pid), and
only while holder.json is still the one it read, so a new holder is never touched. A holder on
another machine cannot be checked from here; its lock is refused as held, naming it.
"""

from __future__ import annotations

import base64
import getpass
import json
import os
import shlex
import socket
import time
from dataclasses import dataclass

from ddops import exits
from ddops.deploy.facts import STATE
from ddops.remote import CommandFailed, ConnectionLost, framing

LOCK_DIR = f"{STATE}/lock"
HELD_EXIT = 75          # flock -E: the lock is held by someone else

_HOLDER = f"{LOCK_DIR}/holder.json"
_PID = f"{LOCK_DIR}/holder.pid"      # the host's lock command: what releasing a dead holder's lock stops
# Runs under the flock, as long as our channel: reports a dead holder's holder.json (`stale`),
# writes ours ($1, base64), says `locked`, waits for `release` (or EOF when we die). The lines
# it writes are remote/framing.py frames, so a holder's command line cannot fake one.
_UNDER_LOCK = framing.script(
    framing.file("stale", _HOLDER),
    f'printf %s "$1" | base64 -d > {_HOLDER}.tmp && mv {_HOLDER}.tmp {_HOLDER} && echo $$ > {_PID}',
    framing.output("locked", "true"),
    'read line; [ "$line" = release ] && rm -f ' + _HOLDER,
    framing.output("released", "true"))
_HOLD = (f"mkdir -p {LOCK_DIR} && exec flock -n -E {HELD_EXIT} {LOCK_DIR}/deploy.lock "
         f"sh -c {shlex.quote(_UNDER_LOCK)} sh ")


class LockHeld(exits.Locked):
    def __init__(self, host: str, holder: dict | None):
        self.holder = holder
        self.fields = {"host": host, "result": "locked", "holder": holder}
        super().__init__(f"{host} is locked by {describe(holder)}; try again when it finishes")


@dataclass(frozen=True)
class Holder:
    user: str
    machine: str
    pid: int
    command: str
    since: float

    @classmethod
    def here(cls, command: str) -> "Holder":
        return cls(getpass.getuser(), socket.gethostname(), os.getpid(), command, time.time())

    def as_dict(self) -> dict:
        return {"user": self.user, "machine": self.machine, "pid": self.pid,
                "command": self.command, "since": self.since}


def describe(holder: dict | None) -> str:
    if not holder:
        return "another deploy (holder details not yet written)"
    since = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(holder.get("since", 0)))
    return (f"{holder.get('user')}@{holder.get('machine')} pid {holder.get('pid')} "
            f"(`{holder.get('command')}` since {since})")


class HostLock:
    """Context manager; `stale` holds the dead holder's details when one was recovered.

    One lock per connection: a HostLock entered while its connection already holds the host's
    lock joins that one (`joined`) and releases nothing, so a change made of steps that each
    take the lock (a switch: stop, deploy, disable) holds it once, from its first step to its last."""

    def __init__(self, remote, holder: Holder):
        self.remote, self.holder = remote, holder
        self.stale: dict | None = None
        self.joined = False
        self.broken: dict | None = None     # a gone holder's lock this taker released
        self.notes: list[str] = []      # what the taker settled before its own work (change.py)
        self._chan = None

    def __enter__(self) -> "HostLock":
        if self.remote.lock is not None:
            self.joined = True
            return self
        payload = base64.b64encode(json.dumps(self.holder.as_dict()).encode()).decode()
        try:
            chan = self.remote.open_channel(_HOLD + payload)
            for line in chan.makefile("r"):
                name, body = framing.parse_line(line)
                if name == "stale" and body:
                    self.stale = _parsed(body) or {"command": "(holder.json unreadable)"}
                elif name == "locked":
                    self._chan, self.remote.lock = chan, self
                    return self
            status = chan.recv_exit_status()
            chan.close()
        except Exception as exc:
            if self.remote.lost(exc):
                raise ConnectionLost(f"{self.remote.label}: taking the deploy lock: connection lost") from None
            raise
        if status == HELD_EXIT:
            holder = _read_holder(self.remote)
            if self.broken is None and gone(holder) and _release_dead(self.remote, holder):
                self.broken = holder
                return self.__enter__()
            raise LockHeld(self.remote.host.name, holder)
        raise CommandFailed(f"{self.remote.label}: cannot take the deploy lock (flock exited {status})")

    def __exit__(self, *exc) -> None:
        self.release()

    def release(self) -> None:
        if self._chan is None:
            return
        chan, self._chan, self.remote.lock = self._chan, None, None
        try:
            chan.sendall(b"release\n")
            chan.shutdown_write()
            chan.recv_exit_status()
        except Exception as exc:
            # connection gone: sshd closed the channel and the host's flock ended with it
            if not self.remote.lost(exc):
                raise
        finally:
            chan.close()


def gone(holder: dict | None) -> bool:
    """The holder ran on this machine and its process is no longer there: no such pid, or one
    started after the holder took the lock (pids are reused)."""
    if not holder or holder.get("machine") != socket.gethostname() or not isinstance(holder.get("pid"), int):
        return False
    started = process_start(holder["pid"])
    return started is None or started > float(holder.get("since") or 0) + 1


def process_start(pid: int) -> float | None:
    """When a process of this machine started (epoch seconds), None when there is none (Linux /proc)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            ticks = int(f.read().rsplit(")", 1)[1].split()[19])   # field 22, starttime, after the comm
        with open("/proc/stat") as f:
            boot = next(int(line.split()[1]) for line in f if line.startswith("btime "))
    except (OSError, ValueError, IndexError, StopIteration):
        return None
    return boot + ticks / os.sysconf("SC_CLK_TCK")


def _release_dead(remote, holder: dict) -> bool:
    """Stop the lock command of a holder that is gone, if holder.json still names it, and wait
    until the lock is free."""
    mark = f'"since": {json.dumps(holder.get("since"))}'
    still = f"grep -qF {shlex.quote(mark)} {_HOLDER}"
    free = f"for i in $(seq 50); do flock -n {LOCK_DIR}/deploy.lock true && break; sleep 0.1; done"
    return remote.run(f"{still} && kill $(cat {_PID}) && {free}", check=False).ok


def _read_holder(remote) -> dict | None:
    return _parsed(remote.run(f"cat {_HOLDER} 2>/dev/null || true").stdout.strip())


def _parsed(text: bytes | str) -> dict | None:
    try:
        found = json.loads(text) if text else None
    except ValueError:
        return None
    return found if isinstance(found, dict) else None


def current_holder(remote) -> dict | None:
    """Who holds the lock now, or None (a holder.json left by a dead holder does not count)."""
    probe = remote.run(f"mkdir -p {LOCK_DIR} && flock -n -E {HELD_EXIT} {LOCK_DIR}/deploy.lock true",
                       check=False)
    return (_read_holder(remote) or {}) if probe.exit_code == HELD_EXIT else None
