"""Wire the fleet loop to real hosts: resolve the plan's hosts, validate every target before
any host is touched, and deploy / revert one host through the deploy engine."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

from ddops import exits
from ddops.inventory import load_inventory
from ddops.profile import load_profile
from ddops.profile.analysis import AnalysisSpec
from ddops.remote import RemoteError, Unreachable, connect, setup
from ddops.rollout import host_changes
from ddops.rollout.fleet.bake import Endpoint
from ddops.rollout.fleet.loop import Limits, MAX_WORKERS, Outcome
from ddops.rollout.fleet.notify import NotifyError, webhooks
from ddops.rollout.fleet.waves import (DONE, FAILED, LOCKED, REFUSED, REVERT_FAILED, REVERTED, UNREACHABLE, HostState,
                                 PlanError, RolloutPlan)

RESULT_STATUS = {"deployed": DONE, "unchanged": DONE, "locked": LOCKED, "refused": REFUSED,
                 "revert-failed": REVERT_FAILED}


@dataclass(frozen=True)
class Fleet:
    plan: RolloutPlan
    hosts: tuple[str, ...]
    targets: dict  # host -> deploy Target (rendered and validated)
    limits: Limits
    canary: int
    wave_size: int
    analysis: AnalysisSpec | None = None
    pause_points: tuple[str, ...] = ()  # plan's or profile's pause_after, resolved by pause_waves
    webhooks: tuple = ()  # ddops.rollout.fleet.notify.Webhook, the plan's then the inventory's


def resolve(plan: RolloutPlan, inventory_path: Path | None) -> Fleet:
    """Everything checked here is bad input (exit 2): no host has been contacted yet."""
    profile = load_profile(plan.profile)
    inventory = load_inventory(inventory_path)
    if plan.hosts:
        unknown = [h for h in plan.hosts if h not in inventory.hosts]
        if unknown:
            raise PlanError(f"{plan.source}: hosts: {unknown[0]}: not in the inventory "
                            f"(known: {', '.join(inventory.hosts) or 'none'})")
        names = plan.hosts
    else:
        names = tuple(h.name for h in inventory.select(dict(plan.selector)))
        if not names:
            raise PlanError(f"{plan.source}: selector: no inventory host has labels {dict(plan.selector)}")
    targets = {h: host_changes.load_target(plan.profile, h, inventory=inventory_path) for h in names}
    for target in targets.values():
        setup(target.host)      # a missing ssh key or known_hosts file is bad input, found before any host
    policy = profile.rollout
    pick = lambda own, default: default if own is None else own  # noqa: E731
    wave_size = pick(plan.wave_size, policy.wave_size)
    limits = Limits(max_failures=pick(plan.max_failures, policy.max_failures),
                    bake_s=pick(plan.bake_s, policy.bake_s), workers=min(wave_size, MAX_WORKERS))
    analysis = pick(plan.analysis, policy.analysis)
    if analysis is not None and not limits.bake_s:
        raise PlanError(f"{plan.source}: analysis: needs bake_s > 0 (the time each wave is watched)")
    try:
        hooks = webhooks([*plan.notify, *inventory.notify], plan.source)
    except NotifyError as err:
        raise PlanError(str(err)) from None
    return Fleet(plan, names, targets, limits, pick(plan.canary, policy.canary), wave_size, analysis,
                 pick(plan.pause_after, tuple(policy.pause_after)), tuple(hooks))


class Endpoints(Mapping):
    """Where analysis reads /metrics and sends probe requests, per host: through an SSH tunnel
    kept open in `tunnels` for a host behind a bastion (or a service on its loopback), opened
    the first time the host is asked for. A rollout resumed to abort, or a wave with nothing
    to bake, opens none."""

    def __init__(self, fleet: Fleet, tunnels: ExitStack) -> None:
        self.fleet, self.tunnels = fleet, tunnels
        self.opened: dict[str, Endpoint] = {}
        self.lock = threading.Lock()        # deploy workers ask in parallel (capture_before)

    def __getitem__(self, host: str) -> Endpoint:
        with self.lock:
            if host not in self.opened:
                t = self.fleet.targets[host]
                self.opened[host] = Endpoint(_dial(self.tunnels, t.host, t.spec.base_url), t.spec.served_model,
                                             host_changes.api_key_of(t.desired.env_text), t.desired.unit_name)
            return self.opened[host]

    def __iter__(self) -> Iterator[str]:
        return iter(self.fleet.targets)

    def __len__(self) -> int:
        return len(self.fleet.targets)


def _dial(tunnels: ExitStack, host, url: str) -> str:
    try:
        return tunnels.enter_context(host_changes.dialable(host, url))
    except RemoteError:     # unreachable now: its samples fail like any unreachable endpoint's
        return url


def plan_hosts(fleet: Fleet, waves) -> dict:
    """`rollout --dry-run`: each host's deploy plan against what it holds now, in wave order."""
    hosts = {}
    for host in (h for wave in waves for h in wave):
        target = fleet.targets[host]
        with connect(target.host) as remote:
            plan = host_changes.plan_of(remote, target)
        hosts[host] = {"steps": [s.as_dict() for s in plan.steps], "unit_diff": plan.unit_diff,
                       "refusals": [r.as_dict() for r in plan.refusals]}
    return hosts


def deployer(fleet: Fleet, command: str, force: bool = False):
    def deploy_one(host: str) -> Outcome:
        target = fleet.targets[host]
        try:
            with connect(target.host) as remote:
                before = host_changes.version_before(remote, target.desired.unit_name)
                result = host_changes.deploy(remote, target, command, force=force)
        except RemoteError as err:     # never connected (Unreachable), or lost before the change began
            return Outcome(UNREACHABLE if isinstance(err, Unreachable) else FAILED, changed=False,
                           detail=f"unreachable: {err}" if isinstance(err, Unreachable) else str(err))
        status = RESULT_STATUS.get(result.result, FAILED if result.code == exits.FAILED else
                                   DONE if result.code == exits.OK else REVERT_FAILED)
        return Outcome(status, changed=result.result == "deployed", detail=result.message,
                       before=before)
    return deploy_one


def reverter(fleet: Fleet, command: str):
    def revert_one(host: str, state: HostState) -> Outcome:
        target = fleet.targets[host]
        unit = target.desired.unit_name
        try:
            with connect(target.host) as remote:
                if state.before == host_changes.NO_UNIT:
                    result = host_changes.remove_unit(remote, unit, command)
                elif state.before:
                    result = host_changes.rollback(remote, unit, state.before, command)
                else:
                    return Outcome(REVERT_FAILED, detail=f"{unit} ran a version ddops has no history "
                                   "entry for; left on the new profile, needs an operator")
        except RemoteError as err:
            return Outcome(REVERT_FAILED, detail=f"unreachable while reverting: {err}")
        if result.code == exits.OK:
            return Outcome(REVERTED, detail=f"back to {state.before}: {result.message}")
        return Outcome(REVERT_FAILED, detail=f"revert to {state.before} failed: {result.message}")
    return revert_one
