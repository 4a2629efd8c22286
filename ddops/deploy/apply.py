"""Apply a plan on one host under its deploy lock.

lock -> facts -> recover an unfinished deploy -> plan -> then exactly the plan's steps (backup
-> push unit and env (0600) -> daemon-reload and enable -> restart -> gate -> history entry),
each through its handler in STEPS -> release. A failed gate reads the
journal, diagnoses it and reverts; a failed revert says exactly what state the host is in.
A pending.json marks a deploy in flight, so one killed midway is found and recovered by the
next run (which restores the backup it left).
"""

from __future__ import annotations

import json
import shlex
import time
from dataclasses import dataclass, field, replace
from typing import Callable

from ddops.deploy import history
from ddops.deploy.change import holding
from ddops.deploy.desired import api_key_of, health_spec
from ddops.deploy.facts import Facts, deploy_dir, read_facts, unit_show
from ddops.deploy.gate import GateReport, GateSpec, run_gate
from ddops.deploy.refusals import refusals
from ddops.deploy.lock import Holder
from ddops.deploy.plan import Desired, Plan, Step, make_plan
from ddops.deploy.recover import recover
from ddops.deploy.revert import revert, take_backup
from ddops.deploy.tunnel import reachable
from ddops.deploy.unitwatch import UnitWatch
from ddops.diagnose import Finding, diagnose
from ddops import exits, systemd
from ddops.remote import RemoteError, framing

q = shlex.quote


@dataclass
class Outcome:
    host: str
    code: int
    result: str                 # deployed | unchanged | reverted | revert-failed | locked
    message: str
    plan: Plan | None = None
    gate: GateReport | None = None
    findings: list[Finding] = field(default_factory=list)
    entry: str | None = None    # history entry id
    notes: list[str] = field(default_factory=list)   # recovered stale lock / unfinished deploy

    def as_dict(self) -> dict:
        return {"host": self.host, "ok": self.code == exits.OK, "exit_code": self.code,
                "meaning": exits.MEANING[self.code], "result": self.result,
                "message": self.message, "plan": self.plan.as_dict() if self.plan else None,
                "gate": self.gate.as_dict() if self.gate else None,
                "diagnosis": [f.as_dict() for f in self.findings], "history_entry": self.entry,
                "notes": self.notes}


def noop_progress(stage: str, text: str) -> None:
    pass


def execute(remote, desired: Desired, spec: GateSpec, holder: Holder,
            progress=noop_progress, *, profile=None, force: bool = False,
            returns_to: str | None = None) -> Outcome:
    """The whole apply phase; returns an Outcome whose `code` is the CLI exit code.

    `profile` (when the change comes from one) adds the fit prediction to the planning checks;
    `force` applies a plan with refusals anyway and records them in the history entry;
    `returns_to` is the history entry a rollback goes back to (kept in the new entry). Runs
    under the host lock (joined when the caller's change already holds it). Raises LockHeld
    (exit 4) and RecoveryFailed (exit 3); SSH lost or a command failed once the host began
    changing is the Outcome `host-error` (exit 3), which says what the host may hold."""
    with holding(remote, holder, progress) as lock:
        notes = list(lock.notes)
        facts = _facts(remote, desired)
        if facts.pending:
            done = _changing(remote, None, lambda: recover(remote, desired, facts, spec.timeout_s, progress))
            if isinstance(done, Outcome):
                done.notes[:0] = notes
                return done
            notes.append(done)
            facts = _facts(remote, desired)
        plan = plan_change(remote, desired, facts, profile)
        if plan.noop:
            return Outcome(remote.host.name, exits.OK, "unchanged",
                           f"{desired.unit_name} already runs {desired.profile}; nothing restarted",
                           plan, notes=notes)
        if plan.refused and not force:
            return refused(remote.host.name, plan, notes)
        outcome = _changing(remote, plan, lambda: _apply(remote, plan, facts, spec, holder, progress, returns_to))
        outcome.notes[:0] = notes
        return outcome


def _changing(remote, plan: Plan | None, change: Callable):
    """Run a step that changes the host; SSH lost or a command failed on the way (the host is
    somewhere between the old and the new files, pending.json says so) is the Outcome `host-error`."""
    try:
        return change()
    except Exception as err:
        if not (isinstance(err, RemoteError) or remote.lost(err)):
            raise
        return half_applied(remote, err, plan)


def half_applied(remote, err: BaseException, plan: Plan | None = None) -> Outcome:
    """The one wording of a change cut short: what failed, and what settles it (a deploy's
    pending.json, a switch's change record: the same command run again settles it first)."""
    why = str(err) if remote.label in str(err) else f"{remote.label}: connection lost ({err})"
    name = remote.host.name
    return Outcome(name, exits.NEEDS_OPERATOR, "host-error",
                   f"{why}; the host may hold a half-applied change: `ddops status --host {name}` names it, "
                   f"and the same command run again (or `ddops recover --host {name}`) settles it first", plan)


def plan_change(remote, desired: Desired, facts: Facts, profile=None) -> Plan:
    """make_plan fed with the knowable checks (run only when the plan would restart something)."""
    plan = make_plan(desired, facts)
    if not (plan.changed or plan.start_needed):
        return plan
    return make_plan(desired, facts, refusals(remote, desired.unit_text, profile, desired.unit_name))


def plan_now(remote, desired: Desired, profile=None) -> Plan:
    """The plan of `desired` against what the host holds now (deploy's and every dry run's)."""
    return plan_change(remote, desired, _facts(remote, desired), profile)


def refused(host: str, plan: Plan, notes: list[str] | None = None) -> Outcome:
    why = "; ".join(str(r) for r in plan.refusals)
    return Outcome(host, exits.BAD_INPUT, "refused",
                   f"refused before touching the host: {why} (--force applies it anyway)",
                   plan, notes=notes or [])


def _facts(remote, desired: Desired) -> Facts:
    return read_facts(remote, desired.unit_name, desired.unit_path, desired.env_path)


@dataclass
class _Run:
    """One execution of a plan's steps: what they share (the pending marker, the restart time)."""
    remote: object
    plan: Plan
    facts: Facts
    spec: GateSpec
    holder: Holder
    progress: Callable
    pending: dict = field(default_factory=dict)
    since: int = 0                  # the restart's time: diagnosis reads the journal from here
    shown: str | None = None        # `systemctl show` right after the restart: the gate's first state
    record: history.Record | None = None            # the history entry, from the gate on
    report: GateReport | None = None
    returns_to: str | None = None   # a rollback's entry

    @property
    def pending_path(self) -> str:
        return f"{deploy_dir(self.plan.desired.unit_name)}/pending.json"

    def mark(self, stage: str) -> None:
        """pending.json says how far a deploy got, so a killed one is recovered by the next run."""
        self.pending = {**self.pending, "stage": stage}
        self.remote.write(self.pending_path, json.dumps(self.pending))


def _apply(remote, plan: Plan, facts: Facts, spec: GateSpec, holder: Holder, progress,
           returns_to: str | None = None) -> Outcome:
    """Execute the plan's steps in order (the recover step ran before planning); the gate step
    ends the run on a failure (diagnose, record, revert), the record step on success."""
    desired = plan.desired
    run = _Run(remote, plan, facts, spec, holder, progress, returns_to=returns_to)
    run.pending = {"profile": desired.profile, "hash": desired.profile_hash, "holder": holder.as_dict(),
                   "started": time.time()}
    run.mark("backing-up")
    for step in plan.steps:
        outcome = STEPS[step.action](run, step)
        if outcome is not None:
            return outcome
    raise AssertionError(f"plan for {desired.unit_name} has no record step")


def _backup(run: _Run, step: Step) -> None:
    run.progress("backup", "saving the current unit and env file")
    take_backup(run.remote, run.facts)


def _write_unit(run: _Run, step: Step) -> None:
    desired = run.plan.desired
    run.mark("pushing")
    run.progress("push", f"{desired.unit_path}, {desired.env_path} (0600)")
    run.remote.write(desired.unit_path, desired.unit_text)


def _write_env(run: _Run, step: Step) -> None:
    run.remote.write(run.plan.desired.env_path, run.plan.desired.env_text, mode=0o600)


def _command(run: _Run, step: Step) -> None:
    run.remote.run(step.command)


def _restart(run: _Run, step: Step) -> None:
    run.progress("restart", step.command)
    # blocking: returns once the job is done, so the gate never sees the stopped gap between
    # stop and start; a failed start is the gate's to report. The host's clock first, in the same
    # round trip: diagnosis reads the journal from that second. The unit's state after it too: the
    # gate's watch starts from it instead of asking again.
    done = framing.ask(run.remote, framing.output("since", "date +%s"), framing.output("restart", step.command),
                       framing.output("shown", unit_show(run.plan.desired.unit_name)),
                       check=False, timeout=run.spec.timeout_s)
    run.since = int(framing.text(done, "since") or 0)
    run.shown = framing.text(done, "shown") or None


def _gate(run: _Run, step: Step) -> Outcome | None:
    desired, remote = run.plan.desired, run.remote
    watch = UnitWatch(remote, desired.unit_name, run.shown)
    with reachable(remote, run.spec.base_url) as url, watch:
        report = run_gate(replace(run.spec, base_url=url), watch,
                          api_key=api_key_of(desired.env_text), progress=run.progress)
    run.record = history.Record.of(desired, run.holder.as_dict(), run.pending["started"], "passed",
                                   gate_spec=run.spec, gate=report.as_dict(),
                                   forced=tuple(r.as_dict() for r in run.plan.refusals),
                                   returns_to=run.returns_to)
    run.report = report
    return None if report.passed else _fail(run)


def _record(run: _Run, step: Step) -> Outcome:
    desired, remote, name = run.plan.desired, run.remote, run.remote.host.name
    entry = history.record(remote, run.facts.history_ids, desired.unit_text, desired.env_text, run.record)
    remote.run(f"rm -f {q(run.pending_path)}")
    return Outcome(name, exits.OK, "deployed", f"{desired.profile} is live on {name} ({run.spec.base_url})",
                   run.plan, run.report, entry=entry.id)


def _recovered(run: _Run, step: Step) -> None:
    """Ran before planning (execute), which then re-planned from the recovered host."""


# every action a plan can hold -> what apply does for it (tests/deploy/test_plan_gate.py checks the
# two lists agree)
STEPS: dict[str, Callable[[_Run, Step], Outcome | None]] = {
    "recover": _recovered, "backup": _backup, "write-unit": _write_unit, "write-env": _write_env,
    "reload-enable": _command, "restart": _restart, "gate": _gate, "record": _record,
}


def diagnose_since(remote, unit: str, since: int, settle_s: float = 3.0) -> list[Finding]:
    """The catalog over every journal line since the restart. A unit that crashes and restarts
    quickly may still have its traceback in journald's stream buffers: sync, and read again for
    a few seconds while nothing matches (sync and read in one round trip)."""
    deadline = time.monotonic() + settle_s
    read = f"{systemd.journal_sync()}; {systemd.journal(unit, 20000, since or None)}"
    while True:
        findings = diagnose(remote.run(read, check=False).stdout)
        if findings or time.monotonic() >= deadline:
            return findings
        time.sleep(0.5)


def _fail(run: _Run) -> Outcome:
    """The gate failed: diagnose, record, revert (pending.json says `revert-failed` if that fails)."""
    desired, remote, plan, report = run.plan.desired, run.remote, run.plan, run.report
    name = remote.host.name
    run.progress("diagnose", "reading the journal")
    findings = diagnose_since(remote, desired.unit_name, run.since)
    failed = replace(run.record, result="failed", diagnosis=tuple(f.as_dict() for f in findings))
    entry = history.record(remote, run.facts.history_ids, desired.unit_text, desired.env_text, failed)
    why = report.failure.detail if report.failure else "gate did not run"
    cause = f"; cause: {findings[0].summary}" if findings else ""
    if not plan.changed:
        # same files as before: nothing to revert to, the service simply does not come up
        remote.run(f"rm -f {q(run.pending_path)}")
        return Outcome(name, exits.FAILED, "failed", f"gate failed: {why}{cause}; unit unchanged",
                       plan, report, findings, entry.id)
    run.progress("revert", "restoring the previous unit and env file")
    result = revert(remote, desired.unit_name, desired.unit_path, desired.env_path,
                    health_spec(run.facts.unit_text, remote.host.address, run.spec.timeout_s), run.progress)
    history.update_result(remote, entry, result="failed-reverted" if result.ok else "revert-failed",
                          revert=result.state)
    if not result.ok:
        run.mark("revert-failed")
        return Outcome(name, exits.NEEDS_OPERATOR, "revert-failed",
                       f"gate failed: {why}{cause}; REVERT FAILED: {result.state}",
                       plan, report, findings, entry.id)
    remote.run(f"rm -f {q(run.pending_path)}")
    return Outcome(name, exits.FAILED, "reverted", f"gate failed: {why}{cause}; {result.state}",
                   plan, report, findings, entry.id)
