"""`ddops hosts trust NAME`: record a host's SSH key in the inventory's known_hosts, after the
operator has seen its fingerprint. ddops never trusts a key on first use by itself: every
connection is checked against known_hosts and refused when the key is unknown or different."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

import typer

from ddops import exits
from ddops.deploy import show
from ddops.inventory import load_inventory
from ddops.remote import fingerprint, host_key, known_hosts_of, recorded_keys
from ddops.shell import confirm, must_ask


def register(app: typer.Typer) -> None:
    hosts = typer.Typer(no_args_is_help=True, help="Inventory hosts: SSH host keys.")
    hosts.command("trust")(trust)
    app.add_typer(hosts, name="hosts")


def trust(name: str = typer.Argument(..., help="inventory host name"),
          yes: bool = typer.Option(False, "--yes", "-y", help="record without asking (you checked the fingerprint)"),
          inventory: Optional[Path] = typer.Option(None, "--inventory", "-i", help="inventory file")) -> None:
    """Show the host's key fingerprint and, once confirmed, add it to the host's known_hosts."""
    host = load_inventory(inventory).host(name)
    path = Path(known_hosts_of(host))
    known, key_type, key = host_key(host)
    print(f"{name}: {known} presents {key_type} {fingerprint(key)}")
    recorded = recorded_keys(str(path), known)
    if (key_type, key) in recorded:
        print(f"already trusted in {path}")
        raise typer.Exit(exits.OK)
    if recorded:
        show.error(f"{path} holds a DIFFERENT key for {known}: the host was re-created or someone is in "
                   f"the middle; remove the old line by hand once you know which", "")
        raise typer.Exit(exits.BAD_INPUT)
    if must_ask(yes, "trust a key"):
        confirm(f"Trust this key for {name}?")
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as handle:
        handle.write(f"{known} {key_type} {key}\n")
    os.chmod(path, 0o644)
    print(f"recorded in {path}")

