"""Facts: what a host holds for one unit, read in a single SSH round trip.

State kept by ddops on the host (all under /var/lib/ddops):
  lock/deploy.lock, lock/holder.json     the per-host deploy lock (see lock.py)
  deploy/<unit>/pending.json             a deploy in flight (removed when it finishes)
  deploy/<unit>/backup/{unit,env}        the files a deploy replaced, for revert
  history/<unit>/NNNN-<ts>/              one entry per deploy (see history.py)
"""

from __future__ import annotations

import base64
import json
import shlex
from dataclasses import dataclass

from ddops import systemd

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


def _section(name: str, cmd: str) -> str:
    return f"printf '\\n@@{name}\\n'; {cmd}"


def _b64_if_file(path: str) -> str:
    return f"if [ -f {q(path)} ]; then printf +; base64 -w0 {q(path)}; fi"


def read_facts(remote, unit_name: str, unit_path: str, env_path: str) -> Facts:
    props = " ".join(f"-p {p}" for p in SHOW_PROPS)
    script = "; ".join([
        _section("unit", _b64_if_file(unit_path)),
        _section("env", _b64_if_file(env_path)),
        _section("show", systemd.show(unit_name, props)),
        _section("pending", _b64_if_file(f"{deploy_dir(unit_name)}/pending.json")),
        _section("history", f"ls {q(history_dir(unit_name))} 2>/dev/null || true"),
        _section("now", "date +%s"),
    ])
    return parse_facts(unit_name, remote.run(script).stdout)


def parse_facts(unit_name: str, out: str) -> Facts:
    parts = {}
    for chunk in out.split("\n@@")[1:]:
        name, _, body = chunk.partition("\n")
        parts[name] = body.strip()
    pending = _decode(parts.get("pending", ""))
    return Facts(unit_name, _decode(parts.get("unit", "")), _decode(parts.get("env", "")),
                 UnitState.parse(parts.get("show", "")),
                 json.loads(pending) if pending else None,
                 tuple(sorted(parts.get("history", "").split())), int(parts.get("now") or 0))


def _decode(text: str) -> str | None:
    return base64.b64decode(text[1:]).decode() if text.startswith("+") else None


def unit_show(unit_name: str) -> str:
    """The one `systemctl show` command whose output UnitState.parse reads."""
    return systemd.show(unit_name, " ".join(f"-p {p}" for p in SHOW_PROPS))


def unit_state(remote, unit_name: str) -> UnitState:
    return UnitState.parse(remote.run(unit_show(unit_name)).stdout)


def journal(remote, unit_name: str, since: int | None = None, lines: int = 300) -> str:
    return remote.run(systemd.journal(unit_name, lines, since or None), check=False).stdout
