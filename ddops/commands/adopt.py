"""`ddops adopt --host H --unit U [--profile P]`: take a hand-written unit into ddops's history."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from ddops import exits
from ddops.deploy import show
from ddops.deploy.adopt import adopt, planned
from ddops.deploy.lock import Holder
from ddops.inventory import load_inventory
from ddops.profile import load_profile
from ddops.remote import connect
from ddops.shell import print_json


def register(app: typer.Typer) -> None:
    app.command("adopt")(adopt_command)


def adopt_command(host: str = typer.Option(..., "--host", help="inventory host name"),
                  unit: str = typer.Option(..., "--unit", help="the hand-written systemd unit"),
                  profile: Optional[str] = typer.Option(
                      None, "--profile", help="profile whose gate a return to this unit must pass"),
                  as_json: bool = typer.Option(False, "--json", help="print one JSON document"),
                  dry_run: bool = typer.Option(False, "--dry-run", help="show what would be recorded; record nothing"),
                  inventory: Optional[Path] = typer.Option(None, "--inventory", "-i", help="inventory file")) -> None:
    """Record a hand-written unit and its env file as history entry 0 (`adopted`); the service is
    not touched. Later deploys, rollbacks and halted rollouts can return to it byte for byte."""
    target = load_inventory(inventory).host(host)
    prof = load_profile(profile) if profile else None
    if dry_run:
        with connect(target) as remote:
            found, _ = planned(remote, unit, prof)
        doc = {"host": host, "unit": found.unit_name, "dry_run": True, "unit_path": found.unit_path,
               "env_path": found.env_path, "hash": found.profile_hash,
               "steps": [{"action": "record", "detail": f"history entry 0 (adopted) of {found.unit_name}: "
                                                        f"{found.unit_path}, {found.env_path}"}]}
        if as_json:
            print_json(exits.OK, **doc)
        else:
            show.console.print(f"{host}: would record {found.unit_name} as history entry 0 "
                               f"({found.unit_path}, {found.env_path}); the service is not touched")
        return
    with connect(target) as remote:     # AdoptError (exit 2) reaches the shell's one mapping
        entry = adopt(remote, unit, Holder.here(f"ddops adopt --host {host} --unit {unit}"), prof)
    record = entry.record
    doc = {"host": host, "unit": entry.unit_name, "history_entry": entry.id, "result": record.result,
           "unit_path": record.unit_path, "env_path": record.env_path, "hash": record.hash}
    if as_json:
        print_json(exits.OK, **doc)
    else:
        show.console.print(f"{host}: {entry.unit_name} adopted as history entry {entry.id} "
                           f"({record.unit_path}, {record.env_path})")
