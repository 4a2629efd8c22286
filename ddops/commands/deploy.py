"""`ddops deploy PROFILE --host NAME` and `ddops demo`."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer

from ddops import exits
from ddops.deploy import Holder, LockHeld, RecoveryFailed, execute, load_target, read_facts
from ddops.deploy import show
from ddops.deploy.apply import plan_change, refused
from ddops.profile.yamlfile import ConfigError
from ddops.remote import RemoteError, connect
from ddops.shell import print_json


def register(app: typer.Typer) -> None:
    app.command("deploy")(deploy)
    app.command("demo")(demo)


def demo() -> None:
    """Lab host up, tiny models pushed, DDTree CPU profile deployed and gated, a request answered."""
    from ddops.deploy import demo as run_demo
    from ddops.lab.errors import LabError
    try:
        code = run_demo.run()
    except (ConfigError, LabError, RemoteError) as err:
        _fail(False, exits.BAD_INPUT, str(err))
    raise typer.Exit(code)


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

    Exit codes: 0 ok, 1 gate failed and reverted, 2 bad input, 3 revert failed, 4 lock held."""
    say = (lambda *a: None) if as_json else show.stage
    say("loading", f"profile {profile} for host {host}")
    try:
        target = load_target(profile, host, profiles_dir=profiles_dir, inventory=inventory,
                             unit_name=unit, port=port)
    except ConfigError as err:
        _fail(as_json, exits.BAD_INPUT, str(err), "`ddops validate` lists every problem")
    if not (yes or dry_run or sys.stdin.isatty()):
        _fail(as_json, exits.BAD_INPUT, "refusing to deploy without --yes: no terminal to confirm on",
              "pass --yes (CI) or --dry-run")
    say("connecting", target.host.address)
    try:
        remote = connect(target.host)
    except RemoteError as err:
        _fail(as_json, exits.BAD_INPUT, str(err))
    with remote:
        try:
            code, doc = _deploy(remote, target, yes=yes, dry_run=dry_run, as_json=as_json, profile=profile,
                                force=force)
        except Exception as err:     # the connection dropped outside the apply phase's own handling
            if not remote.lost(err):
                raise
            why = str(err) if remote.label in str(err) else f"{remote.label}: connection lost ({err})"
            message = (f"{why}; the host may hold a half-applied deploy: the next `ddops deploy` "
                       "to it restores the backup first")
            if not as_json:
                show.error(message)
            code, doc = exits.NEEDS_OPERATOR, {"host": target.host.name, "profile": target.desired.profile,
                                             "exit_code": exits.NEEDS_OPERATOR, "result": "host-error",
                                             "message": message}
    if as_json:
        print_json(code, **doc)
    raise typer.Exit(code)


def _deploy(remote, target, *, yes, dry_run, as_json, profile, force=False) -> tuple[int, dict]:
    desired = target.desired
    say = (lambda *a: None) if as_json else show.stage
    say("facts", f"{desired.unit_name} on {target.host.name}")
    facts = read_facts(remote, desired.unit_name, desired.unit_path, desired.env_path)
    plan = plan_change(remote, desired, facts, target.profile)
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
    holder = Holder.here(f"ddops deploy {profile} --host {target.host.name}" + (" --force" if force else ""))
    try:
        outcome = execute(remote, desired, target.spec, holder,
                          progress=(lambda *a: None) if as_json else show.progress,
                          profile=target.profile, force=force)
    except LockHeld as err:
        if not as_json:
            show.error(str(err))
        return exits.LOCKED, {**base, "exit_code": exits.LOCKED, "result": "locked", "message": str(err),
                             "holder": err.holder}
    except RecoveryFailed as err:
        if not as_json:
            show.error(str(err))
        return exits.NEEDS_OPERATOR, {**base, "exit_code": exits.NEEDS_OPERATOR,
                                    "result": "revert-failed", "message": str(err)}
    if not as_json:
        show.stage("results")
        show.outcome(outcome)
    return outcome.code, {**base, **outcome.as_dict()}


def _fail(as_json: bool, code: int, message: str, hint: str = "") -> None:
    if as_json:
        print_json(code, error=message, hint=hint or None, result="error", message=message)
    else:
        show.error(message, hint)
    raise typer.Exit(code)
