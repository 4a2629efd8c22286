"""`ddops adopt --host H --unit U [--profile P]`: take a hand-written unit into ddops's history."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from ddops import exits
from ddops.deploy import show
from ddops.deploy.adopt import AdoptError, adopt
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
                  inventory: Optional[Path] = typer.Option(None, "--inventory", "-i", help="inventory file")) -> None:
    """Record a hand-written unit and its env file as history entry 0 (`adopted`); the service is
    not touched. Later deploys, rollbacks and halted rollouts can return to it byte for byte."""
    target = load_inventory(inventory).host(host)
    prof = load_profile(profile) if profile else None
    with connect(target) as remote:
        try:
            entry = adopt(remote, unit, Holder.here(f"ddops adopt --host {host} --unit {unit}"), prof)
        except AdoptError as err:
            if as_json:
                print_json(exits.BAD_INPUT, error=str(err))
            else:
                show.error(str(err), "")
            raise typer.Exit(exits.BAD_INPUT)
    doc = {"host": host, "unit": entry.unit_name, "history_entry": entry.id,
           "result": entry.meta["result"], "unit_path": entry.meta["unit_path"], "env_path": entry.meta["env_path"],
           "hash": entry.meta["hash"]}
    if as_json:
        print_json(exits.OK, **doc)
    else:
        show.console.print(f"{host}: {entry.unit_name} adopted as history entry {entry.id} "
                           f"({entry.meta['unit_path']}, {entry.meta['env_path']})")
