"""Day-2 commands: status, logs, history, rollback, recover, diagnose."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape
from rich.table import Table

from ddops import exits
from ddops.exits import BadInput
from ddops.deploy import Holder, show
from ddops.deploy import rollback as rollbacks
from ddops.deploy import change
from ddops.deploy.apply import plan_now
from ddops.deploy.facts import journal
from ddops.deploy import history as host_history
from ddops.deploy import ops
from ddops.diagnose import diagnose as diagnose_text
from ddops.inventory import load_inventory
from ddops.remote import RemoteError, Unreachable, connect
from ddops.shell import confirm, must_ask, print_json

HOST = typer.Option(..., "--host", help="inventory host name")
UNIT = typer.Option(None, "--unit", help="unit name (default: the one ddops deployed there)")
JSON = typer.Option(False, "--json", help="print one JSON document")
INVENTORY = typer.Option(None, "--inventory", "-i", help="inventory file")


def register(app: typer.Typer) -> None:
    app.command("status")(status)
    app.command("logs")(logs)
    app.command("history")(history)
    app.command("rollback")(rollback)
    app.command("recover")(recover)
    app.command("diagnose")(diagnose)


def _hosts(names: list[str], inventory: Path | None):
    inv = load_inventory(inventory)
    return [inv.host(n) for n in names] if names else list(inv.hosts.values())


def _open(name: str, inventory: Path | None):
    """An open connection to one inventory host (Unreachable, exit 6, when it cannot be opened)."""
    [host] = _hosts([name], inventory)
    return connect(host)


def status(host: Optional[str] = typer.Option(None, "--host", help="one host"),
           all_hosts: bool = typer.Option(False, "--all", help="every inventory host"),
           unit: Optional[str] = UNIT, as_json: bool = JSON,
           inventory: Optional[Path] = INVENTORY) -> None:
    """Unit state, profile, version, health and accepted length of ddops services.

    Exit 0 when every host answered; else the most serious host's code (6 when one could not be
    reached, 3 when one failed mid-read; its row says why)."""
    if not host and not all_hosts:
        raise BadInput("say which hosts: --host NAME or --all")
    rows, failed, left = [], {}, []      # failed: exit code -> the first host error with that code
    for h in _hosts([host] if host else [], inventory):
        try:
            with connect(h) as remote:
                left += [{"host": h.name, **found} for found in change.interrupted(remote) + _left_here(h.name)]
                units = [ops.pick_unit(remote, unit)] if unit else ops.units_on(remote)
                rows += [ops.unit_status(remote, u).as_dict() for u in units]
        except (RemoteError, ops.OpsError) as err:
            if isinstance(err, RemoteError):
                failed.setdefault(exits.code_of(err), err)
            rows.append({"host": h.name, "unit": None, "error": str(err), "unreachable": isinstance(err, Unreachable)})
    code = exits.worst(failed)
    if as_json:
        worst = failed.get(code)
        print_json(code, error=str(worst) if worst else None, hint=worst and exits.cause_of(worst)[1], units=rows,
                   interrupted=left)
        raise typer.Exit(code)
    _status_table(rows)
    for found in left:
        show.console.print(f"[bold red]{escape(found['host'])}: interrupted[/bold red] "
                           f"{escape(_interrupted_line(found))}")
    raise typer.Exit(code)


def _left_here(host: str) -> list[dict]:
    """What this machine's own dead commands left on `host`: a shadow start, a rollout."""
    from ddops.rollout.fleet.run_plan import interrupted_rollouts
    from ddops.rollout.shadow.lifecycle import interrupted_start
    return interrupted_start(host) + interrupted_rollouts(host)


def _interrupted_line(found: dict) -> str:
    """A change a dead holder left, what it stopped, and the command that settles it."""
    by = found["holder"] or {}
    when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(found["since"] or 0))
    stopped = f"; it stopped {', '.join(found['production'])}" if found["production"] else ""
    if found.get("candidates"):
        stopped += f"; its candidate(s) {', '.join(found['candidates'])} end with its lease"
    settles = " (any deploy, switch or rollback to the host settles it first)" \
        if found["next"].startswith("ddops recover") else ""
    return (f"`{found['what']}` at its {found['stage']} stage (pid {by.get('pid')} on {by.get('machine')}, "
            f"since {when}){stopped}; run `{found['next']}`{settles}")


def _status_table(rows: list[dict]) -> None:
    table = Table(box=None, padding=(0, 2), header_style="bold")
    for col in ("host", "unit", "state", "profile", "runtime", "health", "accept", "url", "lock"):
        table.add_column(col)
    for r in rows:
        if r.get("error"):
            state = "[red]unreachable[/red]" if r["unreachable"] else "-"
            table.add_row(r["host"], "-", state, escape(r["error"]), "", "", "", "", "")
            continue
        accept = f"{r['accept_length']:.2f}" if r["accept_length"] else "-"
        lock = f"held by {r['lock'].get('user')}@{r['lock'].get('machine')}" if r["lock"] is not None else "-"
        table.add_row(r["host"], r["unit"], f"{r['active']} ({r['sub']})", r["profile"] or "-",
                      r["runtime_version"] or "-", r["health"], accept, r["url"] or "-", lock)
    show.console.print(table)


def logs(host: str = HOST, lines: int = typer.Option(100, "-n", help="lines to show"),
         follow: bool = typer.Option(False, "--follow", "-f", help="keep printing new lines"),
         unit: Optional[str] = UNIT, as_json: bool = JSON, inventory: Optional[Path] = INVENTORY) -> None:
    """The unit's journal on the host (--json: its lines in the envelope's `journal`)."""
    if follow and as_json:
        raise BadInput("--follow streams the journal as text: drop --json (or --follow)")
    with _open(host, inventory) as remote:
        name = ops.pick_unit(remote, unit)
        cmd = ops.logs_command(name, lines, follow)
        if follow:
            try:
                remote.run(cmd, check=False, stream=True)
            except KeyboardInterrupt:
                pass
            return
        text = remote.run(cmd, check=False).stdout
    if as_json:
        print_json(exits.OK, host=host, unit=name, journal=text.splitlines())
        return
    sys.stdout.write(text)


def history(host: str = HOST, unit: Optional[str] = UNIT, as_json: bool = JSON,
            inventory: Optional[Path] = INVENTORY) -> None:
    """Deploys recorded on the host, oldest first."""
    with _open(host, inventory) as remote:
        entries = host_history.entries(remote, ops.pick_unit(remote, unit) if unit else None)
    rows = [{"id": e.id, "unit": e.unit_name, "profile": e.record.profile, "hash": e.record.hash,
             "result": e.record.result, "finished": e.record.finished,
             "by": (e.record.holder or {}).get("user"), "command": (e.record.holder or {}).get("command"),
             "diagnosis": [d.get("cause") for d in e.record.diagnosis]} for e in entries]
    if as_json:
        print_json(exits.OK, host=host, entries=rows)
        return
    table = Table(box=None, padding=(0, 2), header_style="bold")
    for col in ("id", "unit", "profile", "hash", "result", "when", "diagnosis"):
        table.add_column(col)
    for r in rows:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(r["finished"] or 0))
        table.add_row(escape(r["id"]), escape(r["unit"]), escape(r["profile"] or "-"), (r["hash"] or "")[:12],
                      r["result"] or "-", when, escape(", ".join(map(str, r["diagnosis"]))))
    show.console.print(table)


def rollback(host: str = HOST, to: Optional[str] = typer.Option(None, "--to", help="history entry id"),
             unit: Optional[str] = UNIT, yes: bool = typer.Option(False, "--yes", "-y"),
             force: bool = typer.Option(False, "--force", help="apply even when planning knows it cannot start"),
             profiles_dir: Optional[Path] = typer.Option(None, "--profiles-dir",
                                                         help="where the entry's profile lives (for the fit check)"),
             dry_run: bool = typer.Option(False, "--dry-run", help="show the entry and the plan; change nothing"),
             as_json: bool = JSON, inventory: Optional[Path] = INVENTORY) -> None:
    """Deploy an earlier history entry again (gated; reverted if it fails; exit 2 if it cannot start)."""
    ask = must_ask(yes, "roll back", machine=as_json, dry_run=dry_run)
    with _open(host, inventory) as remote:
        try:
            back = rollbacks.find(remote, ops.pick_unit(remote, unit), to, profiles_dir)
        except FileNotFoundError as err:
            raise BadInput(str(err)) from None
        if dry_run:
            _show_rollback_plan(remote, back, as_json, force)
        if not as_json:
            show.stage("rollback", f"{back.unit} on {host} to entry {back.entry.id} ({back.desired.profile})")
        if ask:
            confirm("Apply?")
        holder = Holder.here(f"ddops rollback --host {host} --to {back.entry.id}" + (" --force" if force else ""))
        # LockHeld (exit 4) and RecoveryFailed (exit 3) reach the shell's one mapping
        outcome = back.apply(remote, holder, progress=(lambda *a: None) if as_json else show.progress, force=force)
    if as_json:
        print_json(outcome.code, **outcome.as_dict(), rolled_back_to=back.entry.id)
    else:
        show.outcome(outcome)
    raise typer.Exit(outcome.code)


def _show_rollback_plan(remote, back, as_json: bool, force: bool) -> None:
    """A rollback's --dry-run: the deploy engine's plan of the entry against the host now; exits."""
    desired = back.desired
    plan = plan_now(remote, desired, back.profile)
    code = exits.BAD_INPUT if plan.refused and not force else exits.OK
    if as_json:
        print_json(code, host=remote.host.name, dry_run=True, rolled_back_to=back.entry.id, plan=plan.as_dict())
    else:
        show.stage("rollback", f"{back.unit} to entry {back.entry.id} ({desired.profile}), dry run")
        show.plan(plan)
    raise typer.Exit(code)


def recover(host: str = HOST, yes: bool = typer.Option(False, "--yes", "-y"),
            dry_run: bool = typer.Option(False, "--dry-run", help="say what it would finish or undo; change nothing"),
            as_json: bool = JSON, inventory: Optional[Path] = INVENTORY) -> None:
    """Settle what an interrupted command left on the host: finish a change whose new unit passed
    its gate, else undo it (production as it was); restore every unfinished deploy's backup."""
    ask = must_ask(yes, "recover", machine=as_json, dry_run=dry_run)
    with _open(host, inventory) as remote:
        found = change.interrupted(remote)
        if not as_json:
            for item in found:
                show.stage("recover", _interrupted_line({"host": host, **item}))
        if dry_run:
            plan = change.preview(remote)
            if as_json:
                print_json(exits.OK, host=host, dry_run=True, interrupted=found, steps=plan)
            else:
                for line in plan or [f"nothing interrupted on {host}"]:
                    show.console.print(escape(line))
            return
        if found and ask:
            confirm("Settle it?")
        progress = (lambda *a: None) if as_json else show.progress
        said = change.recover_host(remote, Holder.here(f"ddops recover --host {host}"), progress)
    if as_json:
        print_json(exits.OK, host=host, interrupted=found, settled=said)
        return
    for line in said or [f"nothing interrupted on {host}"]:
        show.console.print(escape(line))


def diagnose(host: str = HOST, unit: Optional[str] = UNIT,
             lines: int = typer.Option(500, "-n", help="journal lines to read"),
             as_json: bool = JSON, inventory: Optional[Path] = INVENTORY) -> None:
    """Read the unit's journal and name the cause of a failure, with the next step."""
    with _open(host, inventory) as remote:
        name = ops.pick_unit(remote, unit)
        findings = diagnose_text(journal(remote, name, lines=lines))
    if as_json:
        print_json(exits.OK, host=host, unit=name, findings=[f.as_dict() for f in findings])
        return
    if not findings:
        show.console.print(f"{host} {name}: no known failure in the last {lines} journal lines")
    for f in findings:
        show.console.print(f"[yellow]{f.cause}[/yellow]: {escape(f.summary)}\n  next: "
                           f"{escape(f.next_step)}\n  seen: {escape(f.evidence)}")
