"""Switch a single-GPU host from one profile to another, sequentially.

A host that cannot hold two servers at once goes, under one host lock from first step to last:
snapshot the running unit (files, history entry, /server_info) -> record the change on the host
(deploy/change.py: what production was, how to finish or undo) -> stop it -> check the GPU is
free -> deploy the new profile through the deploy engine (push, start, gate) -> on a failed gate
the engine restores the previous files and the previous unit is started again here; on success
a replaced unit of another name is disabled. A switch killed anywhere in between is settled by
the next command that takes the host's lock (or `ddops recover`), and `ddops status` names it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ddops import exits, systemd
from ddops.exits import BadInput
from ddops.rollout import host_changes
from ddops.rollout.switch import gpu

SHADOW_SUFFIX = "-shadow.service"


@dataclass
class SwitchReport:
    host: str
    to_profile: str
    to_unit: str
    code: int = exits.OK
    status: str = "switched"  # switched, unchanged, reverted, refused, revert-failed, locked
    detail: str = ""
    before: host_changes.UnitSnapshot | None = None
    gpu: gpu.GpuCheck | None = None
    deploy: host_changes.Result | None = None
    steps: list[str] = field(default_factory=list)

    def as_dict(self) -> dict:
        return {"host": self.host, "to": {"profile": self.to_profile, "unit": self.to_unit},
                "from": self.before.as_dict() if self.before else None, "status": self.status,
                "detail": self.detail, "gpu": self.gpu.as_dict() if self.gpu else None,
                "deploy": self.deploy.as_dict() if self.deploy else None, "steps": self.steps}


def current_unit(remote, wanted: str, explicit: str | None) -> str | None:
    """The production unit to switch away from: --unit, the target's own unit, or the one
    active ddops unit on the host (shadows excluded); None when nothing runs."""
    if explicit:
        return host_changes.pick_unit(remote, explicit)
    if remote.exists(host_changes.unit_paths(wanted)[0]):
        return wanted
    running = [u for u in host_changes.units_on(remote) if not u.endswith(SHADOW_SUFFIX)
               and remote.exists(host_changes.unit_paths(u)[0])
               and host_changes.unit_state(remote, u).active in ("active", "activating")]
    if len(running) > 1:
        raise BadInput(f"{remote.host.name}: several units run ({', '.join(running)}); pass --unit")
    return running[0] if running else None


def plan(remote, target, unit: str | None = None, gpu_timeout_s: float = 60.0) -> dict:
    """What a switch would do on this host now, step by step (`ddops switch --dry-run`): the
    unit it stops, the change record, the GPU wait, the deploy engine's own plan of the new unit
    (its diff and steps), the unit it disables; and the refusals that would stop it first."""
    new_unit = target.desired.unit_name
    old_unit = current_unit(remote, new_unit, unit)
    deploy_plan = host_changes.plan_of(remote, target)
    steps = []
    if old_unit:
        steps += [("snapshot", f"{old_unit}: unit, history entry and /server_info"),
                  ("record-change", f"{host_changes.change.CHANGE}: production {old_unit}, target {new_unit}"),
                  ("stop", systemd.stop(old_unit))]
    steps.append(("gpu-wait", f"up to {gpu_timeout_s:g} s for the GPU to be free (none: go on)"))
    steps += [(f"deploy {s.action}", s.detail) for s in deploy_plan.steps]
    if old_unit and old_unit != new_unit:
        steps.append(("disable", systemd.disable(old_unit)))
    if old_unit:
        steps.append(("end-change", f"remove {host_changes.change.CHANGE}"))
    return {"from": old_unit, "to": new_unit, "deploy": deploy_plan.as_dict(),
            "refusals": [r.as_dict() for r in deploy_plan.refusals],
            "steps": [{"action": a, "detail": d} for a, d in steps]}


def switch(remote, target, *, unit: str | None = None, command: str = "ddops switch",
           gpu_timeout_s: float = 60.0, progress=lambda stage, text: None,
           force: bool = False) -> SwitchReport:
    report = SwitchReport(remote.host.name, target.desired.profile, target.desired.unit_name)
    try:
        with host_changes.holding(remote, command, progress) as held:   # the whole switch, one lock
            report.steps += held.notes
            return _switch(remote, target, report, unit, command, gpu_timeout_s, progress, force)
    except host_changes.LockHeld as err:
        return _end(report, exits.LOCKED, "locked", str(err))


def _switch(remote, target, report: SwitchReport, unit: str | None, command: str, gpu_timeout_s: float,
            progress, force: bool) -> SwitchReport:
    new_unit = report.to_unit
    old_unit = current_unit(remote, new_unit, unit)
    progress("plan", f"checking {target.desired.profile} can start on {remote.host.name}")
    same = old_unit == new_unit and remote.read_text(target.desired.unit_path) == target.desired.unit_text
    refusals = [] if same else host_changes.refusals(remote, target)
    if refusals and not force:
        why = "; ".join(str(r) for r in refusals)
        return _end(report, exits.BAD_INPUT, "refused", f"refused before touching the host: {why} "
                    f"(--force switches anyway){'; ' + old_unit + ' left running' if old_unit else ''}")
    if old_unit:
        progress("snapshot", f"{old_unit}: unit, history entry and /server_info")
        report.before = host_changes.snapshot(remote, old_unit)
        recorded = host_changes.begin_change(remote, command, [old_unit], target.desired)
        progress("stop", systemd.stop(old_unit))
        host_changes.stop_unit(remote, old_unit)
        report.steps.append(f"stopped {old_unit}")
        host_changes.change.advance(remote, recorded, "gpu")
    progress("gpu", "checking the GPU is free")
    report.gpu = gpu.wait_free(remote, gpu_timeout_s)
    report.steps.append(f"gpu: {report.gpu.detail}")
    if not report.gpu.may_start:
        return _restore(remote, report, old_unit, command, f"not starting {new_unit}: {report.gpu.detail}",
                        status="refused")
    if old_unit:
        host_changes.change.advance(remote, recorded, "deploy")
    progress("deploy", f"{target.desired.profile} as {new_unit}")
    report.deploy = host_changes.deploy(remote, target, command, progress, force=force)
    return _after_deploy(remote, report, old_unit, command)


def _after_deploy(remote, report: SwitchReport, old_unit: str | None, command: str) -> SwitchReport:
    result, new_unit = report.deploy, report.to_unit
    if result.code == exits.OK:
        if old_unit and old_unit != new_unit:
            host_changes.disable_unit(remote, old_unit)
            report.steps.append(f"disabled {old_unit} (kept on disk as the last good unit)")
        if old_unit:
            host_changes.change.end(remote)
        status = "unchanged" if result.result == "unchanged" else "switched"
        return _end(report, exits.OK, status, result.message)
    if result.code == exits.NEEDS_OPERATOR:   # the change record stays: status names it, the next command settles it
        return _end(report, exits.NEEDS_OPERATOR, "revert-failed", result.message)
    status = "locked" if result.code == exits.LOCKED else "reverted"
    if old_unit:  # stopped by us before the deploy, so the engine's revert leaves it stopped
        return _restore(remote, report, old_unit, command, result.message, result.code, status)
    return _end(report, result.code, status, result.message)


def _restore(remote, report: SwitchReport, old_unit: str | None, command: str, why: str,
             code: int = exits.FAILED, status: str = "reverted") -> SwitchReport:
    """Start the unit we stopped; `status` says why it had to come back. The change ends here
    when it is back; otherwise its record stays for the next command to settle."""
    if not old_unit:
        return _end(report, code, "refused", why)
    started = host_changes.start_unit(remote, old_unit, command)
    report.steps.append(started.message)
    if started.code != exits.OK:
        return _end(report, exits.NEEDS_OPERATOR, "revert-failed", f"{why}; {started.message}")
    host_changes.change.end(remote)
    return _end(report, code, status, f"{why}; {old_unit} restarted and healthy")


def _end(report: SwitchReport, code: int, status: str, detail: str) -> SwitchReport:
    report.code, report.status, report.detail = code, status, detail
    return report
