"""The one rollback: a unit goes back to a history entry (`--to ID`, or the newest passed entry
that differs from what it runs now) through the deploy engine, gated like a deploy and reverted
if the gate fails. `ddops rollback` and a halted rollout's revert both use it."""

from __future__ import annotations

from dataclasses import dataclass

from ddops.deploy import history, ops
from ddops.deploy.apply import Outcome, execute, noop_progress
from ddops.deploy.gate import GateSpec
from ddops.deploy.lock import Holder
from ddops.deploy.plan import Desired


@dataclass(frozen=True)
class Rollback:
    unit: str
    entry: history.Entry
    desired: Desired
    spec: GateSpec

    def apply(self, remote, holder: Holder, progress=noop_progress, force: bool = False) -> Outcome:
        """Raises LockHeld / RecoveryFailed like every deploy; refused (exit 2) when the entry
        knowably cannot start, unless forced."""
        return execute(remote, self.desired, self.spec, holder, progress, force=force)


def find(remote, unit: str, to: str | None) -> Rollback:
    """What a rollback would deploy; ops.OpsError or FileNotFoundError when there is nothing to go back to."""
    entry = ops.rollback_entry(remote, unit, to)
    desired, spec = ops.desired_of(remote, entry)
    return Rollback(unit, entry, desired, spec)
