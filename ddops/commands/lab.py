"""`ddops lab up|status|down`, `ddops install-runtime`, `ddops push-model`: thin commands over
ddops.lab and ddops.install (parse, call, print). Errors become exit codes in ddops.shell.guard:
lab and install errors carry their own (1, or 2 for bad input)."""

import time
from pathlib import Path
from typing import Optional

import typer

from ddops import exits
from ddops.lab.errors import LabError
from ddops.shell import print_json

HOST_HELP = "host name from the inventory (lab hosts: lab-1, bare-1, ...)"
INVENTORY_HELP = "inventory file (default: $DDOPS_INVENTORY, else lab/inventory.yaml)"


def register(app: typer.Typer) -> None:
    lab = typer.Typer(no_args_is_help=True, help="Lab hosts on this machine: systemd-nspawn containers with sshd.")
    lab.command("up")(lab_up)
    lab.command("status")(lab_status)
    lab.command("down")(lab_down)
    app.add_typer(lab, name="lab")
    app.command("install-runtime")(install_runtime)
    app.command("push-model")(push_model)


def lab_up(count: int = typer.Option(2, "-n", "--count", help="hosts lab-1..lab-N (or bare-1..bare-N)"),
           bare: bool = typer.Option(False, "--bare", help="hosts without the runtime (named bare-N)"),
           debug: bool = typer.Option(False, "--debug", help="show tracebacks")) -> None:
    """Boot N lab hosts (kept if already running) and write their inventory and known_hosts."""
    from ddops.lab import lifecycle
    from ddops.lab.layout import LabLayout
    start = time.monotonic()
    slots = lifecycle.up(LabLayout.from_env(), count, bare)
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


def install_runtime(host: str = typer.Option(..., "--host", help=HOST_HELP),
                    inventory: Optional[Path] = typer.Option(None, "--inventory", help=INVENTORY_HELP),
                    debug: bool = typer.Option(False, "--debug", help="show tracebacks")) -> None:
    """Build the wheel + dependency wheelhouse here, push them, install into /opt/ddops/venv (no index)."""
    from ddops.install.runtime import install_runtime as install
    from ddops.install.wheelhouse import build_bundle
    from ddops.lab.layout import LabLayout
    from ddops.remote import connect

    def work():
        target = find_host(host, inventory)
        bundle = build_bundle(LabLayout.from_env().cache_dir.parent)
        typer.echo(f"connecting to {target.name} ({target.address})")
        with connect(target) as remote:
            return install(remote, bundle)
    start = time.monotonic()
    report = work()
    deps = f"{len(report.dependencies_installed)} dependency wheel(s) installed" if report.dependencies_installed \
        else "dependencies already installed"
    project = "ddops installed" if report.project_installed else "ddops already current"
    typer.echo(f"{report.host}: {deps}; {project}; pushed {report.bytes_pushed / 1e6:.1f} MB "
               f"in {time.monotonic() - start:.1f} s; `python -m serving --help` ok: {report.check}")


def push_model(directory: Path = typer.Argument(..., help="local model directory"),
               host: str = typer.Option(..., "--host", help=HOST_HELP),
               dest: Optional[str] = typer.Option(None, "--dest", help="default /var/lib/ddops/models/<dir name>"),
               inventory: Optional[Path] = typer.Option(None, "--inventory", help=INVENTORY_HELP),
               debug: bool = typer.Option(False, "--debug", help="show tracebacks")) -> None:
    """Copy a model directory to a host; files whose sha256 already matches are skipped."""
    from ddops.install.sync import push_model as push
    from ddops.remote import connect

    def work():
        target = find_host(host, inventory)
        with connect(target) as remote:
            return push(remote, directory, dest)
    start = time.monotonic()
    report = work()
    typer.echo(f"{host}:{report.dest}: copied {len(report.copied)} file(s) ({report.bytes_copied / 1e6:.1f} MB), "
               f"skipped {len(report.skipped)} unchanged, {time.monotonic() - start:.1f} s")


def find_host(name: str, inventory: Optional[Path]):
    from ddops.inventory import load_inventory
    hosts = load_inventory(inventory).hosts
    if name not in hosts:
        raise LabError(f"--host {name}: not in the inventory (hosts: {', '.join(sorted(hosts)) or 'none'})")
    return hosts[name]
