"""The lease a tuner holds on a host while its candidates run there (docs/tune.md).

`ddops tune` starts each candidate as a unit beside production. If the tuner dies (Ctrl-C
during a measurement, a lost link, kill -9) nothing must keep running on its behalf:

- The lease is a transient unit, `ddops-tune-lease.service` (systemd-run: nothing on disk),
  that lives while /run/ddops/tune-lease.json is fresh. The tuner touches that file every
  RENEW_S; untouched for EXPIRES_S, the lease's loop ends and the unit goes.
- Each candidate gets a drop-in `BindsTo=` the lease, so systemd stops the candidate when the
  lease goes, and refuses to start one without it. The drop-in also marks the unit as a
  candidate for whoever settles the host.
- The next command that takes the host's lock (deploy/change.py, `holding`) settles a lease
  whose holder is gone from this machine, or that has expired: it stops the lease and removes
  every candidate unit with its files, and says so.

/run is a tmpfs: after a reboot there is no lease, and no candidate can start.
"""

from __future__ import annotations

import json
import shlex

from ddops import exits, systemd
from ddops.deploy.lock import Holder, describe, gone
from ddops.deploy.recover import unit_paths
from ddops.render import UNIT_DIR

q = shlex.quote
LEASE_UNIT = "ddops-tune-lease.service"
LEASE_FILE = "/run/ddops/tune-lease.json"
DROP_IN = "ddops-lease.conf"
EXPIRES_S = 90      # the lease ends this long after its last renewal (then its candidates stop)
RENEW_S = 15
# The lease's one process: alive while the file exists and was touched less than EXPIRES_S ago.
_LOOP = (f'while [ -f {LEASE_FILE} ] && [ $(( $(date +%s) - $(stat -c %Y {LEASE_FILE}) )) -lt {EXPIRES_S} ]; '
         f'do sleep 5; done')


class LeaseHeld(exits.Locked):
    """Another tuner runs candidates on this host (exit 4)."""


def drop_in_path(unit: str) -> str:
    return f"{UNIT_DIR}/{unit}.d/{DROP_IN}"


def _drop_in() -> str:
    return ("# Written by ddops tune: this candidate runs only while its tuner's lease does;\n"
            "# `ddops recover` or the next deploy on this host removes it once the tuner is gone.\n"
            f"[Unit]\nBindsTo={LEASE_UNIT}\nAfter={LEASE_UNIT}\n")


def _holder(text: str) -> dict | None:
    try:
        found = json.loads(text) if text else None
    except ValueError:
        return {"command": "unreadable lease file"}
    return found if found is None or isinstance(found, dict) else {"command": "unreadable lease file"}


def _read(remote) -> tuple[list[str], dict | None, bool]:
    """In one round trip: the candidate units (those with the drop-in), the lease file's holder,
    and whether the lease is live (its unit active, its file touched within EXPIRES_S)."""
    out = remote.run(f"ls {UNIT_DIR}/*.service.d/{DROP_IN} 2>/dev/null; echo ::; "
                     f"cat {LEASE_FILE} 2>/dev/null; echo; echo ::; "
                     f"{systemd.is_active(LEASE_UNIT)} && [ -f {LEASE_FILE} ] && "
                     f"[ $(( $(date +%s) - $(stat -c %Y {LEASE_FILE}) )) -lt {EXPIRES_S} ] && echo live; true",
                     check=False).stdout
    paths, text, live = (out.split("::") + ["", ""])[:3]
    units = sorted(path.split("/")[-2].removesuffix(".d") for path in paths.split())
    return units, _holder(text.strip()), live.strip() == "live"


def active(remote) -> bool:
    return remote.run(systemd.is_active(LEASE_UNIT), check=False).ok


def take(remote, holder: Holder) -> list[str]:
    """Start this tuner's lease; what a dead tuner left is settled first (returned in words).
    LeaseHeld when a live tuner holds it."""
    said = settle(remote)
    if active(remote):
        raise LeaseHeld(f"{remote.host.name}: {describe(_read(remote)[1])} tunes on this host now; "
                        "try again when it finishes")
    remote.run(f"mkdir -p /run/ddops && printf %s {q(json.dumps(holder.as_dict()))} > {LEASE_FILE}")
    remote.run(systemd.transient(LEASE_UNIT, "ddops tune lease: candidate units live while it does", _LOOP))
    return [said] if said else []


def renew(remote) -> None:
    remote.run(f"touch {LEASE_FILE}")


def bind(remote, unit: str) -> None:
    """Make `unit` a candidate of the lease (before its first start)."""
    remote.write(drop_in_path(unit), _drop_in())
    remote.run(systemd.daemon_reload())


def remove_candidate(remote, unit: str) -> None:
    """Stop a candidate and delete its unit, env file and drop-in (history stays)."""
    unit_path, env_path = unit_paths(unit)
    remote.run(f"rm -rf {q(drop_in_path(unit).rsplit('/', 1)[0])}; " + systemd.remove(unit, unit_path, env_path),
               check=False)


def release(remote, units: list[str] | None = None) -> None:
    """The tuner's end: every candidate removed (`units`, else those found), then the lease."""
    for unit in _read(remote)[0] if units is None else units:
        remove_candidate(remote, unit)
    remote.run(f"rm -f {LEASE_FILE}; {systemd.stop(LEASE_UNIT)} 2>/dev/null; true", check=False)


def left(remote) -> tuple[dict | None, list[str]] | None:
    """What a tuner that is gone left (its holder's process is gone from this machine, or its
    lease is no longer live): (holder, candidate units); None when nothing, or while it runs."""
    units, holder, live = _read(remote)
    if (holder is None and not units) or (live and not gone(holder)):
        return None
    return holder, units


def settle(remote) -> str | None:
    """End what a tuner that is gone left; says what, None when there was nothing to end."""
    found = left(remote)
    if found is None:
        return None
    holder, units = found
    release(remote, units)
    who = describe(holder) if holder else "a tuner whose lease had ended"
    return (f"ended the tuning left by {who}: " +
            (f"removed candidate unit(s) {', '.join(units)}" if units else "no candidate was running"))
