"""Every systemctl and journalctl command ddops runs on a host, spelled once.

Each function returns the shell text; the caller runs it through its `Remote` (which adds sudo
where the inventory says `become: sudo`). Unit names are quoted here, so callers pass them raw.
"""

from __future__ import annotations

import shlex

q = shlex.quote


def daemon_reload() -> str:
    return "systemctl daemon-reload"


def enable(unit: str) -> str:
    return f"systemctl enable {q(unit)} 2>&1"


def reload_and_enable(unit: str) -> str:
    """One round trip; enable runs only after the reload succeeded, and a failure's last line is
    systemctl's own (`Failed to reload daemon: ...` or `Failed to enable unit: ...`)."""
    return f"{daemon_reload()} && {enable(unit)}"


def restart(unit: str) -> str:
    """Blocking: returns once the job is done (Type=exec: the process runs); a unit that hit its
    start limit is reset first so a deploy can start it again."""
    return f"systemctl reset-failed {q(unit)} 2>/dev/null; systemctl restart {q(unit)}"


def start_no_block(unit: str) -> str:
    return f"systemctl reset-failed {q(unit)} 2>/dev/null; systemctl start --no-block {q(unit)}"


def stop(unit: str) -> str:
    return f"systemctl stop {q(unit)}"


def disable(unit: str) -> str:
    return f"systemctl disable {q(unit)} 2>&1"


def disable_now(unit: str) -> str:
    return f"systemctl disable --now {q(unit)} 2>&1"


def remove(unit: str, *paths: str) -> str:
    """Stop and disable the unit, delete its files, forget it (never fails: best effort)."""
    files = " ".join(q(p) for p in paths)
    return (f"{disable_now(unit)}; rm -f {files}; {daemon_reload()}; "
            f"systemctl reset-failed {q(unit)} 2>/dev/null; true")


def is_active(unit: str) -> str:
    """Exits 0 only while the unit is active."""
    return f"systemctl is-active --quiet {q(unit)}"


def transient(unit: str, description: str, command: str) -> str:
    """Run `command` (a shell line) as a transient service: no file on disk, collected when it ends."""
    return (f"systemctl reset-failed {q(unit)} 2>/dev/null; systemd-run --quiet --collect --unit={q(unit)} "
            f"-p Description={q(description)} /bin/sh -c {q(command)}")


def show(unit: str, properties: str) -> str:
    return f"systemctl show {q(unit)} {properties}"


def is_system_running() -> str:
    return "systemctl is-system-running --wait"


def journal(unit: str, lines: int, since: int | None = None, output: str = "cat", follow: bool = False) -> str:
    since_arg = f"--since @{int(since)}" if since is not None else ""
    return (f"journalctl -u {q(unit)} -o {output} --no-pager -n {int(lines)} {since_arg}"
            + (" -f" if follow else "")).rstrip()


def journal_sync() -> str:
    return "journalctl --sync"


def reload(unit: str) -> str:
    return f"systemctl reload {q(unit)}"
