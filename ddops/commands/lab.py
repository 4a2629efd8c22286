"""`ddops lab up|status|down`: thin commands over ddops.lab (parse, call, print). Errors become
exit codes in ddops.shell.guard: lab errors carry their own (1, or 2 for bad input)."""

import time
from pathlib import Path
from typing import Optional

import typer

from ddops import exits
from ddops.lab.errors import LabUsageError
from ddops.shell import print_json

HOST_HELP = "host name from the inventory (lab hosts: lab-1, bare-1, ...)"
INVENTORY_HELP = "inventory file (default: $DDOPS_INVENTORY, else lab/inventory.yaml)"


def register(app: typer.Typer) -> None:
    lab = typer.Typer(no_args_is_help=True, help="Lab hosts on this machine: systemd-nspawn containers with sshd.")
    lab.command("up")(lab_up)
    lab.command("status")(lab_status)
    lab.command("down")(lab_down)
    app.add_typer(lab, name="lab")


def lab_up(count: int = typer.Option(2, "-n", "--count", help="hosts lab-1..lab-N (or bare-1..bare-N)"),
           bare: bool = typer.Option(False, "--bare", help="hosts without the runtime (named bare-N)"),
           ops: bool = typer.Option(False, "--ops", help="reach hosts as a non-root `ops` user with sudo"),
           bastion: bool = typer.Option(False, "--bastion", help="--ops, and only through bastion bare-1 (ProxyJump)"),
           debug: bool = typer.Option(False, "--debug", help="show tracebacks")) -> None:
    """Boot N lab hosts (kept if already running) and write their inventory and known_hosts."""
    from ddops.lab import lifecycle
    from ddops.lab.layout import LabLayout
    start = time.monotonic()
    slots = lifecycle.up(LabLayout.from_env(), count, bare, ops=ops, bastion=bastion)
    typer.echo(f"lab: {len(slots)} host(s) up in {time.monotonic() - start:.1f} s: "
               f"{', '.join(f'{s.name}={s.address}' for s in slots)}")


def lab_status(as_json: bool = typer.Option(False, "--json"),
               debug: bool = typer.Option(False, "--debug", help="show tracebacks")) -> None:
    """Show each lab host: address, state, supervisor PID, whether SSH answers."""
    from ddops.lab import lifecycle
    from ddops.lab.layout import LabLayout
    states = lifecycle.status(LabLayout.from_env())
    rows = [{"host": h.slot.name, "address": h.slot.address, "state": h.state, "pid": h.pid,
             "runtime": "none" if h.slot.bare else "bundled"} for h in states]
    if as_json:
        print_json(exits.OK, hosts=rows)
    elif not rows:
        typer.echo("lab: no hosts (run `ddops lab up`)")
    else:
        typer.echo(f"{'HOST':<10} {'ADDRESS':<14} {'STATE':<9} {'PID':<8} RUNTIME")
        for r in rows:
            typer.echo(f"{r['host']:<10} {r['address']:<14} {r['state']:<9} {str(r['pid'] or '-'):<8} {r['runtime']}")


def lab_down(debug: bool = typer.Option(False, "--debug", help="show tracebacks")) -> None:
    """Halt and remove every lab host, namespace, veth, the bridge and the lab's state."""
    from ddops.lab import lifecycle
    from ddops.lab.layout import LabLayout
    removed = lifecycle.down(LabLayout.from_env())
    typer.echo(f"lab: down ({len(removed)} host(s) removed)")


def find_host(name: str, inventory: Optional[Path]):
    from ddops.inventory import load_inventory
    hosts = load_inventory(inventory).hosts
    if name not in hosts:
        raise LabUsageError(f"--host {name}: not in the inventory (hosts: {', '.join(sorted(hosts)) or 'none'})")
    return hosts[name]
