"""Deploy one profile to one host, pyinfra style: facts (read the host) -> plan (pure) ->
apply (lock, backup, push, restart, gate, revert on failure, history).

Public API (used by the CLI and by ddops.rollout):
  load_target(profile, host, ...) -> Target        everything loaded and rendered, no I/O on hosts
  read_facts(remote, unit, unit_path, env_path)    what the host holds now
  make_plan(desired, facts) -> Plan                 pure
  execute(remote, desired, spec, holder) -> Outcome lock + apply + gate + revert; .code is the exit code
  Outcome.code is one of ddops.exits's codes.
"""

from ddops.deploy.apply import Outcome, execute
from ddops.deploy.facts import Facts, read_facts
from ddops.deploy.gate import GateReport, GateSpec, run_gate
from ddops.deploy.lock import Holder, HostLock, LockHeld
from ddops.deploy.plan import Desired, Plan, make_plan
from ddops.deploy.recover import RecoveryFailed
from ddops.deploy.target import Target, load_target

__all__ = [
    "Desired", "Facts", "GateReport", "GateSpec", "Holder", "HostLock", "LockHeld", "Outcome",
    "Plan", "RecoveryFailed", "Target", "execute", "load_target", "make_plan", "read_facts",
    "run_gate",
]
