"""Finish off a deploy that was killed after it began changing the host.

A deploy marks its unit with deploy/<unit>/pending.json (apply.py) before its first write; the
next command that takes the host's lock and finds one restores the backup the killed deploy
left, records the files it had pushed as a `killed-recovered` history entry, and says so.
"""

from __future__ import annotations

import shlex
from dataclasses import replace

from ddops import exits
from ddops.deploy import history
from ddops.deploy.desired import health_spec
from ddops.deploy.facts import Facts, deploy_dir
from ddops.deploy.lock import describe
from ddops.deploy.plan import Desired
from ddops.deploy.revert import revert
from ddops.render import ENV_DIR, UNIT_DIR

q = shlex.quote
RESTORED_AT = ("pushing", "revert-failed")   # the pending stages whose recovery restores the backup


class RecoveryFailed(exits.RevertFailed):
    """An unfinished deploy found on the host could not be undone (exit 3)."""


def unit_paths(unit: str) -> tuple[str, str]:
    """Where ddops keeps a unit's file and its env file."""
    return f"{UNIT_DIR}/{unit}", f"{ENV_DIR}/{unit.removesuffix('.service')}.env"


def at_paths(unit: str) -> Desired:
    """A unit known only by name (a pending deploy found by another command): its paths, no files."""
    unit_path, env_path = unit_paths(unit)
    return Desired(unit, unit_path, "", env_path, "", "?", "")


def recover(remote, desired: Desired, facts: Facts, timeout_s: float, progress=lambda s, t: None) -> str:
    """Undo the deploy pending.json names; returns what was done, in words."""
    pending = facts.pending or {}
    who = describe(pending.get("holder"))
    stage = pending.get("stage")
    if stage in RESTORED_AT:
        if stage == "pushing":
            _record_killed(remote, desired, facts, pending)
        backup_unit = remote.read_text(f"{deploy_dir(desired.unit_name)}/backup/unit")
        progress("recover", f"restoring the backup left by {who}")
        result = revert(remote, desired.unit_name, desired.unit_path, desired.env_path,
                        health_spec(backup_unit, remote.host.address, timeout_s), progress)
        if not result.ok:
            raise RecoveryFailed(f"{remote.host.name}: unfinished deploy of {pending.get('profile')} "
                                 f"by {who} could not be recovered: {result.state}")
        what = "an unfinished deploy" if stage == "pushing" else "the failed revert of a deploy"
        text = f"recovered {what} of {pending.get('profile')} by {who}: {result.state}"
    else:
        text = f"cleared an unfinished deploy of {pending.get('profile')} by {who} (host untouched)"
    remote.run(f"rm -f {q(deploy_dir(desired.unit_name))}/pending.json")
    return text


def _record_killed(remote, desired: Desired, facts: Facts, pending: dict) -> None:
    """Audit: the files the killed deploy had pushed, as a history entry of their own."""
    if facts.unit_text is None:
        return
    killed = replace(desired, profile=pending.get("profile") or "?", profile_hash=pending.get("hash") or "")
    record = history.Record.of(killed, pending.get("holder"), pending.get("started") or 0.0, "killed-recovered")
    history.record(remote, facts.history_ids, facts.unit_text, facts.env_text or "", record)
