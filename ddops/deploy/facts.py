"""Facts: what a host holds for one unit, read in a single SSH round trip.

State kept by ddops on the host (all under /var/lib/ddops):
  lock/deploy.lock, lock/holder.json     the per-host deploy lock (see lock.py)
  deploy/<unit>/pending.json             a deploy in flight (removed when it finishes)
  deploy/<unit>/backup/{unit,env}        the files a deploy replaced, for revert
  history/<unit>/NNNN-<ts>/              one entry per deploy (see history.py)
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass

from ddops import systemd
from ddops.remote import framing

q = shlex.quote

STATE = "/var/lib/ddops"
SHOW_PROPS = ("LoadState", "ActiveState", "SubState", "UnitFileState", "NRestarts",
              "ExecMainPID", "ExecMainStartTimestampMonotonic")


def deploy_dir(unit: str) -> str:
    return f"{STATE}/deploy/{unit}"


def history_dir(unit: str) -> str:
    return f"{STATE}/history/{unit}"


@dataclass(frozen=True)
class UnitState:
    load: str = "not-found"
    active: str = "inactive"      # systemd ActiveState
    sub: str = "dead"
    enabled: str = ""             # UnitFileState
    restarts: int = 0             # NRestarts
    main_pid: int = 0
    started_us: int = 0           # ExecMainStartTimestampMonotonic: changes on every (re)start

    @classmethod
    def parse(cls, show: str) -> "UnitState":
        props = dict(line.split("=", 1) for line in show.splitlines() if "=" in line)
        num = lambda k: int(props.get(k) or 0)  # noqa: E731
        return cls(props.get("LoadState", "not-found"), props.get("ActiveState", "inactive"),
                   props.get("SubState", "dead"), props.get("UnitFileState", ""),
                   num("NRestarts"), num("ExecMainPID"), num("ExecMainStartTimestampMonotonic"))


@dataclass(frozen=True)
class Facts:
    unit_name: str
    unit_text: str | None         # None: no unit file on the host
    env_text: str | None
    state: UnitState
    pending: dict | None          # pending.json of a deploy that never finished
    history_ids: tuple[str, ...]  # entry directory names, oldest first
    host_time: int                # host clock, epoch seconds (journal --since)


def read_facts(remote, unit_name: str, unit_path: str, env_path: str) -> Facts:
    """Every fact of one unit in one round trip (remote/framing.py frames the answers)."""
    answers = framing.ask(remote,
                          framing.file("unit", unit_path), framing.file("env", env_path),
                          framing.output("show", unit_show(unit_name)),
                          framing.file("pending", f"{deploy_dir(unit_name)}/pending.json"),
                          framing.output("history", f"ls {q(history_dir(unit_name))} 2>/dev/null"),
                          framing.output("now", "date +%s"))
    return facts_of(unit_name, answers)


def facts_of(unit_name: str, answers: dict[str, bytes | None]) -> Facts:
    """Pure: the Facts in read_facts' answers."""
    text = lambda name: framing.text(answers, name) or ""  # noqa: E731
    pending = framing.text(answers, "pending")
    return Facts(unit_name, framing.text(answers, "unit"), framing.text(answers, "env"),
                 UnitState.parse(text("show")), json.loads(pending) if pending else None,
                 tuple(sorted(text("history").split())), int(text("now").strip() or 0))


def unit_show(unit_name: str) -> str:
    """The one `systemctl show` command whose output UnitState.parse reads."""
    return systemd.show(unit_name, " ".join(f"-p {p}" for p in SHOW_PROPS))


def unit_state(remote, unit_name: str) -> UnitState:
    return UnitState.parse(remote.run(unit_show(unit_name)).stdout)


def journal(remote, unit_name: str, since: int | None = None, lines: int = 300) -> str:
    return remote.run(systemd.journal(unit_name, lines, since or None), check=False).stdout
