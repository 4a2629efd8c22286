"""The one rollback: a unit goes back to a history entry (`--to ID`, or by default the one
before what it runs now, ops.previous_good) through the deploy engine, gated like a deploy and reverted
if the gate fails. `ddops rollback` and a halted rollout's revert both use it.

Planning checks the entry's unit like a deploy (refusals.py). The fit prediction needs the
profile: the one named in the entry is used when it still renders exactly the entry's unit
(same content hash, the unit's own --port); otherwise a host that declares GPUs gets a note
that fit was not checked."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ddops.deploy import history, ops
from ddops.deploy.apply import Outcome, execute, noop_progress
from ddops.deploy.desired import unit_argv
from ddops.deploy.gate import GateSpec
from ddops.profile.launch import read_launch
from ddops.deploy.lock import Holder
from ddops.deploy.plan import Desired
from ddops.profile import Profile, load_profile
from ddops.profile.yamlfile import ConfigError
from ddops.render import render


@dataclass(frozen=True)
class Rollback:
    unit: str
    entry: history.Entry
    desired: Desired
    spec: GateSpec
    profile: Profile | None = None    # for the fit check; None when not known to match the entry
    note: str | None = None           # why fit was not checked, where it could matter

    def apply(self, remote, holder: Holder, progress=noop_progress, force: bool = False) -> Outcome:
        """Raises LockHeld / RecoveryFailed like every deploy; refused (exit 2) when the entry
        knowably cannot start (or is predicted not to fit), unless forced."""
        outcome = execute(remote, self.desired, self.spec, holder, progress, profile=self.profile, force=force,
                          returns_to=self.entry.id)
        if self.note:
            outcome.notes.append(self.note)
        return outcome


def find(remote, unit: str, to: str | None, profiles_dir: Path | None = None) -> Rollback:
    """What a rollback would deploy; ops.OpsError or FileNotFoundError when there is nothing to go back to."""
    entry = ops.rollback_entry(remote, unit, to)
    desired, spec = ops.desired_of(remote, entry)
    profile, why = profile_of(entry, desired.unit_text, remote.host, profiles_dir)
    note = f"fit not checked: {why}" if why and remote.host.gpu is not None else None
    return Rollback(unit, entry, desired, spec, profile, note)


def profile_of(entry: history.Entry, unit_text: str, host, profiles_dir: Path | None = None
               ) -> tuple[Profile | None, str | None]:
    """(the profile that rendered the entry's unit, None) or (None, why it is not known)."""
    name = entry.record.profile
    if not name or name == "?":
        return None, f"entry {entry.id} names no profile"
    port = read_launch(unit_argv(unit_text)).get("service.port")
    try:
        profile = load_profile(name, profiles_dir)
        rendered = render(profile, host, unit_name=entry.unit_name, port=int(port) if port else None)
    except (ConfigError, ValueError) as err:
        return None, f"profile {name} of entry {entry.id} cannot be rendered here ({str(err).splitlines()[0]})"
    if rendered.content_hash != entry.record.hash:
        return None, f"profile {name} has changed since entry {entry.id} was deployed"
    return profile, None
