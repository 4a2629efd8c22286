"""`ddops install-runtime` and `ddops push-model`: one host (--host) or many at once (--hosts
a,b,c or --selector key=value), in parallel with a progress bar per host (ddops.install.many)."""

from __future__ import annotations

import sys
import time
from dataclasses import asdict, dataclass, is_dataclass
from pathlib import Path
from typing import Optional

import typer

from ddops import exits
from ddops.commands.lab import HOST_HELP, INVENTORY_HELP, find_host
from ddops.lab.errors import LabUsageError
from ddops.shell import print_json

HOSTS = typer.Option(None, "--hosts", help="several inventory hosts, comma-separated")
JSON = typer.Option(False, "--json", help="print one JSON document (one entry per host)")
SELECTOR = typer.Option(None, "--selector", help="every inventory host with these labels: key=value[,key=value]")


def register(app: typer.Typer) -> None:
    app.command("install-runtime")(install_runtime)
    app.command("push-model")(push_model)


def pick_hosts(host: str | None, hosts: str | None, selector: str | None, inventory: Path | None) -> list:
    if sum(bool(x) for x in (host, hosts, selector)) != 1:
        raise LabUsageError("say which hosts: one of --host NAME, --hosts a,b,c, --selector key=value")
    if host:
        return [find_host(host, inventory)]
    if hosts:
        return [find_host(name.strip(), inventory) for name in hosts.split(",") if name.strip()]
    from ddops.inventory import load_inventory
    labels = dict(pair.split("=", 1) for pair in selector.split(",") if "=" in pair)
    if not labels:
        raise LabUsageError(f"--selector {selector!r}: expected key=value[,key=value]")
    found = load_inventory(inventory).select(labels)
    if not found:
        raise LabUsageError(f"--selector {selector}: no inventory host has these labels")
    return found


def _summary(outcomes, line, as_json: bool = False) -> None:
    """One line per host (or the envelope with one entry per host); the exit code is the most
    serious host's (6 a host could not be reached, 3 a host failed midway)."""
    failed = [o.host for o in outcomes if not o.ok]
    code = exits.worst(o.code for o in outcomes)
    if as_json:
        print_json(code, error=f"failed on {', '.join(failed)}" if failed else None,
                   hosts=[{"host": o.host, "ok": o.ok, "exit_code": o.code, "detail": o.detail,
                           "report": asdict(o.report) if is_dataclass(o.report) else None} for o in outcomes])
    else:
        for outcome in outcomes:
            typer.echo(line(outcome) if outcome.ok else f"{outcome.host}: FAILED: {outcome.detail}")
    if code:
        raise typer.Exit(code)


def install_runtime(host: Optional[str] = typer.Option(None, "--host", help=HOST_HELP), hosts: Optional[str] = HOSTS,
                    selector: Optional[str] = SELECTOR,
                    inventory: Optional[Path] = typer.Option(None, "--inventory", "-i", help=INVENTORY_HELP),
                    runtime: str = typer.Option("bundled", "--runtime",
                                                help="bundled (/opt/ddops/venv), vllm (/opt/vllm/venv) or "
                                                     "sglang (/opt/sglang/venv)"),
                    version: Optional[str] = typer.Option(None, "--version",
                                                          help="sglang on GPU hosts: the release (default 0.5.15)"),
                    as_json: bool = JSON,
                    dry_run: bool = typer.Option(False, "--dry-run", help="build the wheels here, show what each "
                                                                          "host lacks; change no host"),
                    debug: bool = typer.Option(False, "--debug", help="show tracebacks")) -> None:
    """Build the wheel + dependency wheelhouse here, push them, install into /opt/ddops/venv (no index);
    --runtime vllm installs vLLM 0.32 into /opt/vllm/venv (CPU build on hosts without a GPU);
    --runtime sglang installs SGLang into /opt/sglang/venv (0.5.15's CPU engine on hosts without one)."""
    installer = INSTALLERS.get(runtime)
    if installer is None:
        raise LabUsageError(f"--runtime {runtime!r}: ddops installs {', '.join(INSTALLERS)}")
    if version and not installer.picks_version:
        choosers = ", ".join(name for name, i in INSTALLERS.items() if i.picks_version)
        raise LabUsageError(f"--version: ddops installs one {installer.label} release; --version picks {choosers}'s")
    if installer.module is None:
        _install_bundled(host, hosts, selector, inventory, as_json, dry_run)
    else:
        _install_peer(installer, host, hosts, selector, inventory, as_json, version, dry_run)


def _previewed(outcomes, as_json: bool) -> None:
    """`install-runtime --dry-run`: per host, what it would create, push and install."""
    def line(o) -> str:
        p = o.report
        todo = ([f"create {p.venv}"] if p.venv_created else []) + \
            ([f"push and install {len(p.wheels)} wheel(s)"] if p.wheels else []) + (["install ddops"] if p.project else [])
        return f"{p.host}: would {', '.join(todo)}" if todo else f"{p.host}: {p.venv} is current; nothing to do"
    _summary(outcomes, line, as_json)


def quiet():
    """No progress bars: a dry run moves no bytes."""
    from rich.console import Console
    return Console(quiet=True)


def note(text: str) -> None:
    """A wheelhouse's first-time notes go to stderr: stdout carries only the result (one JSON
    document under --json)."""
    print(text, file=sys.stderr, flush=True)


def _install_bundled(host, hosts, selector, inventory, as_json: bool, dry_run: bool = False) -> None:
    from ddops.install.many import run_on_hosts
    from ddops.install.bundled import install_runtime as install, preview
    from ddops.install.wheelhouse import build_bundle
    from ddops.lab.layout import LabLayout

    targets = pick_hosts(host, hosts, selector, inventory)
    bundle = build_bundle(LabLayout.from_env().cache_dir.parent, log=note)
    if dry_run:
        return _previewed(run_on_hosts(targets, lambda remote, tick: preview(remote, bundle), quiet()), as_json)
    start = time.monotonic()
    outcomes = run_on_hosts(targets, lambda remote, tick: install(remote, bundle, log=lambda _: None, progress=tick))
    took = time.monotonic() - start

    def line(o) -> str:
        r = o.report
        deps = f"{len(r.dependencies_installed)} dependency wheel(s) installed" if r.dependencies_installed \
            else "dependencies already installed"
        project = "ddops installed" if r.project_installed else "ddops already current"
        return (f"{r.host}: {deps}; {project}; pushed {r.bytes_pushed / 1e6:.1f} MB in {took:.1f} s; "
                f"`python -m serving --help` ok: {r.check}")
    _summary(outcomes, line, as_json)


def _install_peer(installer: "Installer", host, hosts, selector, inventory, as_json: bool,
                  version: str | None, dry_run: bool = False) -> None:
    """vLLM or SGLang from their pinned wheelhouses: a CPU build for hosts without a GPU."""
    import importlib
    from ddops.install.many import run_on_hosts
    from ddops.lab.layout import LabLayout

    module = importlib.import_module(installer.module)
    targets = pick_hosts(host, hosts, selector, inventory)
    cache = LabLayout.from_env().cache_dir.parent
    builds = sorted({module.build_for(t.gpu) for t in targets})
    houses = {build: module.build_wheelhouse(cache, build, *([version] if version else []), log=note)
              for build in builds}
    by_name = {t.name: houses[module.build_for(t.gpu)] for t in targets}
    if dry_run:
        from ddops.install.pinned import preview
        return _previewed(run_on_hosts(targets, lambda remote, tick: preview(remote, by_name[remote.host.name]),
                                       quiet()), as_json)
    install = module.install
    start = time.monotonic()
    outcomes = run_on_hosts(targets, lambda remote, tick: install(remote, by_name[remote.host.name],
                                                                 log=lambda _: None, progress=tick))
    took = time.monotonic() - start
    name = installer.label

    def line(o) -> str:
        r = o.report
        wheels = f"{len(r.wheels_installed)} wheel(s) installed" if r.wheels_installed else "already installed"
        return (f"{r.host}: {name} ({r.build} build) {wheels}; pushed {r.bytes_pushed / 1e6:.1f} MB in {took:.1f} s; "
                f"its parser reports {name} {r.version} with {r.flags} flags")
    _summary(outcomes, line, as_json)


@dataclass(frozen=True)
class Installer:
    """How ddops installs one runtime (--runtime)."""
    label: str
    module: str | None = None       # a peer's module: build_for, build_wheelhouse, install (pinned.py)
    picks_version: bool = False     # --version chooses its release


# The runtimes ddops installs itself, by --runtime.
INSTALLERS = {"bundled": Installer("ddops"),
              "vllm": Installer("vLLM", "ddops.install.vllm"),
              "sglang": Installer("SGLang", "ddops.install.sglang", picks_version=True)}


def push_model(directory: Path = typer.Argument(..., help="local model directory"),
               host: Optional[str] = typer.Option(None, "--host", help=HOST_HELP), hosts: Optional[str] = HOSTS,
               selector: Optional[str] = SELECTOR,
               dest: Optional[str] = typer.Option(None, "--dest", help="default /var/lib/ddops/models/<dir name>"),
               inventory: Optional[Path] = typer.Option(None, "--inventory", "-i", help=INVENTORY_HELP),
               as_json: bool = JSON,
               dry_run: bool = typer.Option(False, "--dry-run", help="show what each host lacks; copy nothing"),
               debug: bool = typer.Option(False, "--debug", help="show tracebacks")) -> None:
    """Copy a model directory to hosts in parallel; files whose sha256 already matches are skipped,
    an interrupted upload resumes, every file is sha256-checked on the host."""
    from ddops.install.many import preview_push_many, push_model_many
    if dry_run:
        shown = preview_push_many(pick_hosts(host, hosts, selector, inventory), directory, dest)
        return _summary(shown, lambda o: (f"{o.host}:{o.report.dest}: would copy {len(o.report.copied)} file(s) "
                                          f"({o.report.bytes_copied / 1e6:.1f} MB): "
                                          f"{', '.join(o.report.copied) or 'none'}; {len(o.report.skipped)} "
                                          "already there"), as_json)
    start = time.monotonic()
    outcomes = push_model_many(pick_hosts(host, hosts, selector, inventory), directory, dest)
    took = time.monotonic() - start
    _summary(outcomes, lambda o: (f"{o.host}:{o.report.dest}: copied {len(o.report.copied)} file(s) "
                                  f"({o.report.bytes_copied / 1e6:.1f} MB), skipped {len(o.report.skipped)} "
                                  f"unchanged, {took:.1f} s"), as_json)
