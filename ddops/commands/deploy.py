"""`ddops deploy PROFILE --host NAME`."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from ddops import exits
from ddops.deploy import Holder, execute, load_target
from ddops.deploy import show
from ddops.deploy.apply import plan_now, refused
from ddops.remote import connect
from ddops.shell import must_ask, print_json


def register(app: typer.Typer) -> None:
    app.command("deploy")(deploy)


def deploy(
    profile: str = typer.Argument(..., help="profile name (or path to a YAML file)"),
    host: str = typer.Option(..., "--host", help="inventory host name"),
    yes: bool = typer.Option(False, "--yes", "-y", help="apply without asking"),
    dry_run: bool = typer.Option(False, "--dry-run", help="stop after showing the plan"),
    as_json: bool = typer.Option(False, "--json", help="print one JSON document"),
    force: bool = typer.Option(False, "--force", help="apply even when planning knows it cannot start (recorded in history)"),
    unit: Optional[str] = typer.Option(None, "--unit", help="systemd unit name (default: the profile's)"),
    port: Optional[int] = typer.Option(None, "--port", help="port (default: the profile's)"),
    profiles_dir: Optional[Path] = typer.Option(None, "--profiles-dir", help="where profiles live"),
    inventory: Optional[Path] = typer.Option(None, "--inventory", "-i", help="inventory file"),
) -> None:
    """Deploy PROFILE to one host: facts -> plan -> confirm -> apply -> gate (revert on failure).

    Exit codes: 0 ok, 1 gate failed and reverted, 2 bad input or refused, 3 a revert failed or
    SSH was lost mid-change, 4 lock held, 6 host unreachable (ddops/exits.py)."""
    say = (lambda *a: None) if as_json else show.stage
    say("loading", f"profile {profile} for host {host}")
    target = load_target(profile, host, profiles_dir=profiles_dir, inventory=inventory, unit_name=unit, port=port)
    ask = must_ask(yes, "deploy", machine=as_json, dry_run=dry_run)
    say("connecting", target.host.address)
    with connect(target.host) as remote:
        code, doc = deploy_on(remote, target, yes=not ask, dry_run=dry_run, as_json=as_json,
                              command=f"ddops deploy {profile} --host {target.host.name}" + (" --force" if force else ""),
                              force=force)
    if as_json:
        print_json(code, error=None if code == exits.OK else doc.get("message"), **doc)
    raise typer.Exit(code)


def deploy_on(remote, target, *, yes, dry_run, as_json, command: str, force=False) -> tuple[int, dict]:
    """The one deploy path (ddops deploy, ddops demo): facts, plan and its refusals, confirm, lock, apply, gate."""
    desired = target.desired
    say = (lambda *a: None) if as_json else show.stage
    say("facts", f"{desired.unit_name} on {target.host.name}")
    plan = plan_now(remote, desired, target.profile)
    say("plan", f"{desired.profile} ({desired.profile_hash[:12]}) -> {desired.unit_name}")
    if not as_json:
        show.plan(plan)
    base = {"host": target.host.name, "profile": desired.profile, "plan": plan.as_dict()}
    if plan.refused and not force:
        outcome = refused(target.host.name, plan)
        if not as_json:
            show.error(outcome.message)
        return outcome.code, {**base, **outcome.as_dict()}
    if dry_run:
        return exits.OK, {**base, "exit_code": exits.OK, "result": "dry-run"}
    if plan.noop:
        yes = True      # nothing to confirm; still checked under the lock, a deploy may be running
    if not yes and not typer.confirm(f"Apply to {target.host.name}?", default=False):
        return exits.BAD_INPUT, {**base, "exit_code": exits.BAD_INPUT, "result": "declined"}
    say("applying", "taking the host lock")
    holder = Holder.here(command)
    # LockHeld (exit 4) and RecoveryFailed (exit 3) reach the shell's one mapping
    outcome = execute(remote, desired, target.spec, holder, progress=(lambda *a: None) if as_json else show.progress,
                      profile=target.profile, force=force)
    if not as_json:
        show.stage("results")
        show.outcome(outcome)
    return outcome.code, {**base, **outcome.as_dict()}
