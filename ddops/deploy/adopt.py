"""Adopt a hand-written unit: record what the host runs now as history entry 0 (`adopted`), so
deploys, rollbacks and halted rollouts can return to it byte for byte.

The entry holds the unit file and its EnvironmentFile exactly as found, and a gate spec read
from the unit's command line (or the named profile's), which a later rollback to the entry is
gated with. A unit ddops already has history for is not adopted again.
"""

from __future__ import annotations

import hashlib
import time

from ddops import exits
from ddops.deploy import history
from ddops.deploy.desired import env_file_of, gate_spec, unit_argv
from ddops.deploy.lock import Holder, HostLock
from ddops.deploy.plan import Desired
from ddops.render import ENV_DIR, UNIT_DIR

ADOPTED = "adopted"


class AdoptError(exits.BadInput):
    """The unit cannot be adopted (missing, no command line, already has history): exit 2."""


def content_hash(unit_text: str, env_text: str) -> str:
    """Identity of hand-written files (they carry no ddops header): `adopted-<sha256>`."""
    digest = hashlib.sha256(unit_text.encode() + b"\0" + env_text.encode()).hexdigest()
    return f"{ADOPTED}-{digest}"


def planned(remote, unit: str, profile=None) -> tuple[Desired, object]:
    """What adopt would record (the unit's files as they are, and the gate a return must pass);
    AdoptError (exit 2) when it cannot. Reads only."""
    unit = unit if unit.endswith(".service") else f"{unit}.service"
    unit_path = f"{UNIT_DIR}/{unit}"
    unit_text = remote.read_text(unit_path)
    if unit_text is None:
        raise AdoptError(f"{remote.host.name}: {unit_path} does not exist")
    argv = unit_argv(unit_text)
    if not argv:
        raise AdoptError(f"{remote.host.name}: {unit_path} has no ExecStart= to gate a return to it")
    env_path = env_file_of(unit_text) or f"{ENV_DIR}/{unit.removesuffix('.service')}.env"
    env_text = remote.read_text(env_path) or ""
    refuse_if_deployed(remote, unit)
    found = Desired(unit, unit_path, unit_text, env_path, env_text,
                    profile.name if profile else f"{unit} (hand-written)", content_hash(unit_text, env_text))
    return found, gate_spec(profile, argv, remote.host.address)


def refuse_if_deployed(remote, unit: str) -> None:
    existing = history.entries(remote, unit)
    if existing:
        raise AdoptError(f"{remote.host.name}: {unit} already has {len(existing)} history entr"
                         f"{'y' if len(existing) == 1 else 'ies'}; adopt records entry 0 of a unit "
                         "ddops has never deployed")


def adopt(remote, unit: str, holder: Holder, profile=None) -> history.Entry:
    found, spec = planned(remote, unit, profile)
    with HostLock(remote, holder):
        refuse_if_deployed(remote, found.unit_name)      # again under the lock: a deploy may have won
        record = history.Record.of(found, holder.as_dict(), time.time(), ADOPTED, gate_spec=spec)
        return history.record(remote, (), found.unit_text, found.env_text, record, number=0)
