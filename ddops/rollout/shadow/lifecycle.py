"""Shadow rollouts: a candidate profile running beside production as `<service>-shadow`.

start    deploy the candidate under the shadow unit name and port, gated like any deploy;
compare  replay prompts to both, judge against the candidate's rollout policy, save JSON;
promote  switch production to the candidate's profile, then remove the shadow;
abort    remove the shadow; production is never touched.
The running shadow is recorded locally (records.py), so later commands need no arguments.
"""

from __future__ import annotations

import os
import time
from contextlib import ExitStack
from dataclasses import dataclass, replace
from pathlib import Path

from ddops import exits, systemd
from ddops.exits import BadInput
from ddops.fit import gpu_from_gib, needs_gpu, read_models, remote_reader
from ddops.fit.memory_models import predict
from ddops.profile import load_profile
from ddops.profile.schema import RolloutSpec
from ddops.rollout import host_changes
from ddops.rollout.records import (ShadowRecord, clear_shadow, load_shadow, save_result,
                                  save_shadow, shadow_file)
from ddops.rollout.shadow import mirrored
from ddops.rollout.shadow.compare import Comparison, Endpoint, Settings, compare
from ddops.rollout.shadow.judge import Verdict, judge
from ddops.rollout.shadow.prompts import load_prompts
from ddops.rollout.switch.gpu import free_mib
from ddops.rollout.switch.single_gpu import plan as plan_switch, switch


def shadow_unit(unit: str) -> str:
    """llm.service -> llm-shadow.service"""
    return f"{unit.removesuffix('.service')}-shadow.service"


@dataclass(frozen=True)
class CompareRun:
    comparison: Comparison
    verdict: Verdict
    results_file: Path
    production: Endpoint
    shadow: Endpoint

    def to_dict(self) -> dict:
        return {"production_url": self.production.url, "shadow_url": self.shadow.url,
                "comparison": self.comparison.to_dict(), "verdict": self.verdict.to_dict(),
                "results_file": str(self.results_file)}


def api_key_of(profile) -> str | None:
    """The key the profile's server expects, read on this machine as the deploy does."""
    secrets = profile.service.secrets
    if secrets.api_key_env:
        return os.environ.get(secrets.api_key_env)
    if secrets.api_key_file:
        return Path(secrets.api_key_file).read_text().strip()
    return None


def endpoints(record: ShadowRecord | None, production_url: str | None, shadow_url: str | None,
              profile_name: str | None) -> tuple[Endpoint, Endpoint, RolloutSpec]:
    """Both endpoints and the policy: explicit URLs win over the recorded shadow."""
    profile_name = profile_name or (record.profile if record else None)
    profile = load_profile(profile_name) if profile_name else None
    if record is not None and not (production_url and shadow_url):
        require_gated(record)
    prod = production_url or (record.production_url if record else None)
    cand = shadow_url or (record.url if record else None)
    if not (prod and cand):
        raise BadInput("no shadow recorded: run `ddops shadow start PROFILE --host NAME` first, "
                       "or pass --production-url and --shadow-url")
    key = api_key_of(profile) if profile else None
    policy = profile.rollout if profile else RolloutSpec()
    return (Endpoint("production", prod.rstrip("/"), api_key=key),
            Endpoint("shadow", cand.rstrip("/"), api_key=key), policy)


def run_compare(*, prompts_path: Path | None, settings: Settings, production_url: str | None = None,
                shadow_url: str | None = None, profile_name: str | None = None,
                results_dir: Path | None = None, inventory: Path | None = None) -> CompareRun:
    """Recorded endpoints are reached through SSH where the host needs it (bastion, ssh_config
    alias, loopback bind); URLs given explicitly are dialed as they are."""
    record = load_shadow()
    prod, cand, policy = endpoints(record, production_url, shadow_url, profile_name)
    prompts = load_prompts(prompts_path)
    with ExitStack() as tunnels:
        hosts = _recorded_hosts(record, production_url, shadow_url, inventory)
        live = [replace(e, url=tunnels.enter_context(host_changes.dialable(hosts[e.name], e.url))) if e.name in hosts
                else e for e in (prod, cand)]
        comparison = compare(*live, prompts, settings)
    verdict = judge(comparison, policy)
    doc = {"shadow": record.to_dict() if record else None, "policy": policy.model_dump(),
           "comparison": comparison.to_dict(), "verdict": verdict.to_dict()}
    path = save_result("shadow-compare", doc, results_dir)
    return CompareRun(comparison, verdict, path, prod, cand)


def run_mirrored(*, production_url: str | None = None, shadow_url: str | None = None,
                 profile_name: str | None = None, results_dir: Path | None = None,
                 inventory: Path | None = None, requirement=None) -> tuple:
    """The mirrored traffic's comparison so far, judged by `requirement` (default: the policy's
    analysis.mirror, else MirrorRequirement's defaults); saved like a replay's result."""
    from ddops.profile.analysis import MirrorRequirement
    record = load_shadow()
    prod, cand, policy = endpoints(record, production_url, shadow_url, profile_name)
    hosts = _recorded_hosts(record, production_url, shadow_url, inventory)
    result = mirrored.read_recorded(record, prod, cand, hosts)
    analysis = policy.analysis
    requirement = requirement or (analysis.mirror if analysis and analysis.mirror else MirrorRequirement())
    verdict = mirrored.judge_mirrored(result, requirement)
    return result, verdict, mirrored.save(result, verdict, record, prod, cand, results_dir), prod, cand


def _recorded_hosts(record: ShadowRecord | None, production_url: str | None, shadow_url: str | None,
                    inventory: Path | None) -> dict:
    """Endpoint name -> inventory host, for the endpoints that come from the shadow record. A
    host the inventory cannot name (no inventory here, or not in it) is dialed at its URL."""
    if record is None or (production_url and shadow_url):
        return {}
    from ddops.inventory import load_inventory
    from ddops.profile.yamlfile import ConfigError
    try:
        hosts = load_inventory(inventory).hosts
    except ConfigError:
        return {}
    names = {"production": None if production_url else record.production_host,
             "shadow": None if shadow_url else record.host}
    return {role: hosts[name] for role, name in names.items() if name in hosts}


# -- lifecycle: start, promote, abort (through the deploy engine) ----------------------------

@dataclass(frozen=True)
class Lifecycle:
    """What a start/promote/abort did; `code` follows the exit-code contract."""

    code: int
    status: str
    detail: str
    shadow: ShadowRecord | None
    hosts: tuple = ()  # host_changes.Result of each host touched

    def to_dict(self) -> dict:
        return {"status": self.status, "detail": self.detail,
                "shadow": self.shadow.to_dict() if self.shadow else None,
                "hosts": [h.as_dict() for h in self.hosts]}


def production_of(remote, unit: str):
    """Production's status on its host; BadInput when it is not running there."""
    status = host_changes.unit_status(remote, unit)
    if status.active != "active" or not status.url:
        raise BadInput(f"{remote.host.name}: production unit {unit} is {status.active}, not running; "
                       f"deploy production first (or pass --production-unit)")
    return status


def refuse_unless_fits(remote, profile) -> None:
    """A shadow beside production gets only the GPU memory production leaves free: plan the
    shadow on exactly that, by its runtime's own memory model."""
    if not needs_gpu(profile):
        return
    free = free_mib(remote)
    if free is None:
        return  # no nvidia-smi: nothing to measure; the gate still catches a failed start
    prediction = fits_beside(profile, free, read_models(profile, remote_reader(remote)), remote.host.name)
    if not prediction.fits:
        raise BadInput(f"{profile.name} does not fit beside production on {remote.host.name}: "
                       f"{'; '.join(prediction.reasons)}; run the shadow on another host (--host)")


def fits_beside(profile, free: int, models, host: str):
    """The profile's prediction on a card of the `free` MiB production leaves (ddops.fit.memory_models)."""
    return predict(profile, gpu_from_gib(free / 1024, f"{free} MiB left free by production on {host}"), models)


@dataclass(frozen=True)
class Candidate:
    """A shadow start checked and rendered, before any host changed."""
    profile: object
    target: object
    prod_host: str
    prod_unit: str
    port: int
    prod: object          # production's UnitStatus
    source: object        # where mirroring reads production (None without --mirror)


def prepare(profile_name: str, host: str, *, port: int | None, production_host: str | None,
            production_unit: str | None, inventory: Path | None, connect, force: bool = False,
            mirror: bool = False, sample: float = 0.0) -> Candidate:
    """Everything `shadow start` checks before it changes a host (bad input: exit 2)."""
    if sample and not mirror:
        raise BadInput("--sample keeps samples of mirrored requests: give --mirror too")
    if not 0 <= sample <= 1:
        raise BadInput(f"--sample: a fraction 0..1 of mirrored requests kept as samples, got {sample}")
    refuse_unless_finishes(load_shadow(), profile_name, host)
    profile = load_profile(profile_name)
    prod_unit = production_unit or profile.service.unit
    prod_host = production_host or host
    port = port or profile.service.port + 1
    target = host_changes.load_target(profile_name, host, inventory=inventory,
                                      unit_name=shadow_unit(prod_unit), port=port)
    source = None
    with connect(prod_host) as prod_remote:
        prod = production_of(prod_remote, prod_unit)
        if mirror:
            with host_changes.dialable(prod_remote.host, prod.url) as url:
                source = mirrored.refuse_unless_mirrorable(
                    profile, prod_remote.host, prod_remote.read_text(host_changes.unit_paths(prod_unit)[0]),
                    Endpoint("production", url, api_key=api_key_of(profile)))
        if prod_host == host and not force:
            refuse_unless_fits(prod_remote, profile)
    return Candidate(profile, target, prod_host, prod_unit, port, prod, source)


def refuse_unless_finishes(existing: ShadowRecord | None, profile_name: str, host: str) -> None:
    """One shadow at a time: a new start is bad input while one is recorded, except the rerun of
    a start whose process is gone (same profile and host), which finishes it."""
    if existing is None:
        return
    if existing.started_ok:
        raise BadInput(f"a shadow of {existing.profile} already runs on {existing.host} "
                       f"({existing.unit}); `ddops shadow promote` or `ddops shadow abort` it first")
    if not host_changes.gone(existing.starting_by):
        raise BadInput(f"a shadow start is under way: {host_changes.describe(existing.starting_by)}; wait for it")
    if (existing.profile, existing.host) != (profile_name, host):
        raise BadInput(f"`{existing.starting_by.get('command')}` was interrupted; run it again to finish "
                       f"it, or `ddops shadow abort` to remove what it left")


def interrupted_start(host: str) -> list[dict]:
    """The recorded shadow's start, when its process died before the shadow passed its gate and
    `host` is where it runs, in `ddops status`'s words for what a dead holder left."""
    record = load_shadow()
    if record is None or record.started_ok or record.host != host or not host_changes.gone(record.starting_by):
        return []
    by = record.starting_by
    return [{"what": by.get("command"), "stage": "shadow start", "holder": by, "since": by.get("since"),
             "production": [], "shadow": record.unit,
             "next": f"{by.get('command')} (finishes it) or ddops shadow abort (removes it)"}]


def preview_start(candidate: Candidate, host: str, connect, mirror: bool) -> dict:
    """`shadow start --dry-run`: the shadow's deploy plan on its host, and what follows it."""
    with connect(host) as remote:
        plan = host_changes.plan_of(remote, candidate.target)
    steps = [("record-start", f"the shadow's start in {shadow_file()} (this machine), before any host change")]
    steps += [(f"deploy {s.action}", s.detail) for s in plan.steps]
    steps.append(("record", f"the shadow as gated in {shadow_file()}"))
    if mirror:
        steps.append(("mirror", f"production {candidate.prod_unit} on {candidate.prod_host} copies its "
                                "requests to the shadow"))
    return _preview(steps, [r.as_dict() for r in plan.refusals], deploy=plan.as_dict())


def start(profile_name: str, host: str, *, port: int | None, production_host: str | None,
          production_unit: str | None, inventory: Path | None, connect, progress,
          force: bool = False, mirror: bool = False, sample: float = 0.0) -> Lifecycle:
    """Deploy the candidate as <unit>-shadow beside production; record it on success. With
    `mirror`, production's tap then copies its requests to the shadow (docs/mirror.md)."""
    candidate = prepare(profile_name, host, port=port, production_host=production_host,
                        production_unit=production_unit, inventory=inventory, connect=connect,
                        force=force, mirror=mirror, sample=sample)
    target, prod, prod_host, prod_unit = candidate.target, candidate.prod, candidate.prod_host, candidate.prod_unit
    port = candidate.port
    progress("deploy", f"{candidate.profile.name} as {target.desired.unit_name} on {host}:{port}")
    command = f"ddops shadow start {profile_name} --host {host}"
    resumed = load_shadow() is not None       # prepare() let only an interrupted start of this shadow through
    record = ShadowRecord(profile=profile_name, host=host, unit=target.desired.unit_name, port=port,
                          url=target.spec.base_url, production_host=prod_host,
                          production_unit=prod_unit, production_url=prod.url,
                          production_profile=prod.profile, started=time.time(),
                          starting_by=host_changes.Holder.here(command).as_dict())
    if resumed:
        progress("resume", f"finishing the interrupted `{command}`")
    with connect(host) as remote:
        save_shadow(record)     # before the host changes: a start killed anywhere is told and finished
        result = host_changes.deploy(remote, target, command, progress, force=force)
    if result.code != 0:
        if result.code == exits.FAILED or (not resumed and result.code in (exits.BAD_INPUT, exits.LOCKED)):
            clear_shadow()    # nothing of the shadow runs: reverted, or refused before any change
        return Lifecycle(result.code, "not started", result.message, None, (result,))
    record = replace(record, starting_by=None)
    save_shadow(record)
    detail = f"shadow {record.unit} gated and running at {record.url}"
    if mirror:
        record, note = _start_mirror(record, candidate.profile, sample, candidate.source, connect, progress)
        detail += "; " + note
    return Lifecycle(0, "started", f"{detail}; production {prod_unit} on {prod_host} untouched",
                     record, (result,))


def _preview(steps: list[tuple[str, str]], refusals: list[dict] | None = None, **more) -> dict:
    """A dry run's document: the steps in order and the refusals that would stop them first."""
    return {"steps": [{"action": a, "detail": d} for a, d in steps], "refusals": refusals or [], **more}


def _start_mirror(record: ShadowRecord, profile, sample: float, source, connect,
                  progress) -> tuple[ShadowRecord, str]:
    """Point production's tap at the shadow (the shadow's URL as production's host dials it),
    or start the relay beside production when its runtime mirrors through its request logs."""
    key = api_key_of(profile)
    with connect(record.production_host) as remote:
        if source.kind == "request_log":
            tap_url, tap = mirrored.start_relay(remote, record, source, key, sample)
            record = replace(record, tap_url=tap_url)
            save_shadow(record)
        else:
            with host_changes.dialable(remote.host, record.production_url) as url:
                tap = mirrored.start_tap(Endpoint("production", url, api_key=key), record.url, key, sample)
    via = "its request logs, through the relay beside it" if record.tap_url else "its tap"
    progress("mirror", f"production copies its requests to {tap['target']} from {via} (samples: {sample:.0%})")
    return record, f"production mirrors to it from {via} (queue {tap['queue_limit']}, samples {sample:.0%})"


def preview_abort() -> dict:
    """`shadow abort --dry-run`: what abort would remove."""
    record = _recorded()
    steps = [("remove-relay", f"the mirror relay beside {record.production_unit} on {record.production_host}")] \
        if record.tap_url else []
    unit_path, env_path = host_changes.unit_paths(record.unit)
    steps += [("remove", f"{record.host}: {systemd.remove(record.unit, unit_path, env_path)}"),
              ("forget", f"the shadow in {shadow_file()} (this machine)")]
    return _preview(steps)


def preview_promote(*, inventory: Path | None, connect) -> dict:
    """`shadow promote --dry-run`: on production's host, the shadow's removal then the switch's
    steps; elsewhere, production's deploy plan, then the shadow's removal."""
    record = _recorded(gated=True)
    port = int(record.production_url.rsplit(":", 1)[1].strip("/"))
    target = host_changes.load_target(record.profile, record.production_host, inventory=inventory,
                                      unit_name=record.production_unit, port=port)
    remove = ("remove", f"{record.host}: {record.unit}")
    with connect(record.production_host) as remote:
        if record.host == record.production_host:
            shown = plan_switch(remote, target, record.production_unit)
            return _preview([remove] + [(s["action"], s["detail"]) for s in shown["steps"]],
                            shown["refusals"], deploy=shown["deploy"])
        plan = host_changes.plan_of(remote, target)
    return _preview([(f"deploy {s.action}", s.detail) for s in plan.steps] + [remove],
                    [r.as_dict() for r in plan.refusals], deploy=plan.as_dict())


def abort(*, connect) -> Lifecycle:
    """Remove the shadow; production is not touched (its state is reported, not changed). A
    start that was interrupted is removed too; one under way is left to finish."""
    record = _recorded()
    if not record.started_ok and not host_changes.gone(record.starting_by):
        raise BadInput(unfinished(record))
    _remove_relay(record, connect)
    with connect(record.host) as remote:
        result = host_changes.remove_unit(remote, record.unit, "ddops shadow abort")
    if result.code != 0:
        return Lifecycle(result.code, "abort failed", result.message, record, (result,))
    clear_shadow()
    return Lifecycle(0, "aborted", f"{result.message} on {record.host}; production "
                                   f"{record.production_unit} on {record.production_host} untouched",
                     record, (result,))


def _remove_relay(record: ShadowRecord, connect) -> None:
    """The mirror relay beside production goes with its shadow (it would only back off)."""
    if record.tap_url:
        from ddops.rollout.shadow import relay_unit
        with connect(record.production_host) as remote, host_changes.holding(remote, "ddops shadow (the relay removed)"):
            relay_unit.remove(remote, record.production_unit)


def promote(*, inventory: Path | None, connect, progress) -> Lifecycle:
    """Make the shadow's profile production (gated, reverted on failure), then remove the shadow.

    On the production host itself the shadow goes first (one GPU cannot hold three servers
    while production restarts) and production switches sequentially; if that switch fails,
    production is back on its previous profile and the shadow is gone. Elsewhere production
    is deployed first and the shadow removed only after production passed its gate."""
    record = _recorded(gated=True)
    _remove_relay(record, connect)
    port = int(record.production_url.rsplit(":", 1)[1].strip("/"))
    target = host_changes.load_target(record.profile, record.production_host, inventory=inventory,
                                 unit_name=record.production_unit, port=port)
    command = f"ddops shadow promote ({record.profile})"
    if record.host == record.production_host:
        return _promote_in_place(record, target, command, connect, progress)
    return _promote_elsewhere(record, target, command, connect, progress)


def _promote_in_place(record: ShadowRecord, target, command: str, connect, progress) -> Lifecycle:
    """Under one host lock: remove the shadow, then switch production. The local record goes only
    when this ends: a promote killed midway is run again as the same promote (the host's change
    record is settled first, so production comes back before it goes again)."""
    with connect(record.host) as remote:
        try:
            with host_changes.holding(remote, command, progress) as held:
                removed = host_changes.remove_unit(remote, record.unit, command)
                if removed.code != 0:
                    return Lifecycle(removed.code, "promote failed", removed.message, record, (removed,))
                report = switch(remote, target, unit=record.production_unit, command=command, progress=progress)
        except host_changes.LockHeld as err:
            return Lifecycle(exits.LOCKED, "promote failed", str(err), record)
    if report.code in (exits.OK, exits.FAILED, exits.BAD_INPUT):
        clear_shadow()   # promoted, or production back as it was (or never stopped): the shadow is gone
    # else the host needs a look (exit 3: SSH lost mid-switch, say): the record stays, so the same
    # promote run again settles the host's change record first and promotes this shadow again
    touched = (removed, report.deploy) if report.deploy else (removed,)
    gone = [f"the shadow {record.unit} was removed to make room: `ddops shadow start {record.profile} "
            f"--host {record.host}` to try it again"] if report.code in (exits.FAILED, exits.BAD_INPUT) else []
    detail = "; ".join([*held.notes, report.detail, *gone])
    return Lifecycle(report.code, "promoted" if report.code == 0 else "promote failed", detail, record, touched)


def _promote_elsewhere(record: ShadowRecord, target, command: str, connect, progress) -> Lifecycle:
    with connect(record.production_host) as remote:
        deployed = host_changes.deploy(remote, target, command, progress)
    if deployed.code != 0:
        return Lifecycle(deployed.code, "promote failed", f"{deployed.message}; the shadow "
                         f"keeps running on {record.host}", record, (deployed,))
    with connect(record.host) as remote:
        removed = host_changes.remove_unit(remote, record.unit, command)
    if removed.code == 0:
        clear_shadow()      # else the record stays: `ddops shadow abort` removes the shadow later
    status = "promoted" if removed.code == 0 else "promoted, shadow not removed"
    return Lifecycle(removed.code, status, f"{deployed.message}; {removed.message}", record,
                     (deployed, removed))


def _recorded(gated: bool = False) -> ShadowRecord:
    """The recorded shadow; `gated`: one whose start finished (a promote needs it)."""
    record = load_shadow()
    if record is None:
        raise BadInput("no shadow recorded here: `ddops shadow start PROFILE --host NAME` first")
    if gated:
        require_gated(record)
    return record


def unfinished(record: ShadowRecord) -> str | None:
    """What is left of the shadow's start, in words; None once it passed its gate."""
    if record.started_ok:
        return None
    state = "under way" if not host_changes.gone(record.starting_by) else \
        "interrupted: run it again to finish it, or `ddops shadow abort`"
    return f"the shadow's start has not finished (`{record.starting_by.get('command')}`, {state})"


def require_gated(record: ShadowRecord) -> None:
    """A shadow whose start has not finished is not compared or promoted (bad input, exit 2)."""
    if not record.started_ok:
        raise BadInput(unfinished(record))


def require_mirrored(requirement, inventory: Path | None, out) -> int | None:
    """A rollout whose analysis requires a mirroring shadow's result, before its canary: the
    recorded shadow's mirrored comparison judged by `requirement`; None when it passes, else
    the command's exit code (1, nothing changed). No shadow recorded is bad input (exit 2)."""
    if load_shadow() is None:
        raise BadInput("analysis.mirror: the rollout requires a mirroring shadow's result, and no "
                       "shadow is recorded here (`ddops shadow start PROFILE --host H --mirror`)")
    result, verdict, path, _, _ = run_mirrored(inventory=inventory, requirement=requirement)
    out.event("mirror", f"mirrored shadow: {'passed' if verdict.passed else 'failed'} "
                        f"({result.requests} requests; result {path})", verdict=verdict.to_dict(),
              results_file=str(path))
    if verdict.passed:
        return None
    return out.fail(1, "the mirroring shadow does not meet analysis.mirror: " + "; ".join(verdict.reasons),
                    "nothing was changed; let more traffic be mirrored, or fix the candidate")
