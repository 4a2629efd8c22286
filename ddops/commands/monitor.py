"""`ddops monitor render`: the operator's Prometheus targets, rules and dashboard."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Optional

import typer

from ddops import exits
from ddops.exits import BadInput
from ddops.remote import RemoteError, connect
from ddops.shell import print_json

INVENTORY = typer.Option(None, "--inventory", "-i", help="inventory file")


def register(app: typer.Typer) -> None:
    monitor = typer.Typer(no_args_is_help=True, help="The operator's monitoring: Prometheus targets, rules, dashboard.")
    monitor.command("render")(render)
    app.add_typer(monitor, name="monitor")


def render(out: Path = typer.Option(..., "--out", help="folder to write (made if missing)"),
           host: Optional[list[str]] = typer.Option(None, "--host", help="only these hosts (default: every one)"),
           interval: str = typer.Option("15s", "--interval", help="scrape interval written into scrape.yml"),
           as_json: bool = typer.Option(False, "--json", help="print one JSON document"),
           inventory: Optional[Path] = INVENTORY) -> None:
    """Write Prometheus targets, rules and a Grafana dashboard for every ddops service.

    Reads each host's ddops units (nothing on the hosts changes) and writes into OUT: file_sd
    targets (one job per API key, its key in a 0600 file), scrape_configs to paste into
    prometheus.yml, recording and alert rules, and dashboard.json. Exit 6 or 3 when a host
    could not be read; nothing is written then (a partial target list would drop its alerts)."""
    if not re.fullmatch(r"[1-9][0-9]*(ms|s|m|h)", interval):
        raise BadInput(f"--interval: a Prometheus duration such as 15s or 1m, got {interval!r}")
    from ddops.commands.operate import _hosts
    from ddops.monitor import render as write_out
    from ddops.monitor.targets import UNKNOWN, read_host
    from ddops.rollout.records import load_shadow

    shadow = load_shadow()
    where = (shadow.host, shadow.unit) if shadow else None
    targets = []
    for h in _hosts(list(host or []), inventory):
        try:
            with connect(h) as remote:
                targets += read_host(remote, where)
        except RemoteError as err:
            code = exits.code_of(err)
            if as_json:
                print_json(code, error=str(err))
            else:
                typer.echo(f"error: {h.name}: {err}; nothing written", err=True)
            raise typer.Exit(code)
    bounds, unknown = monitoring_of({t.labels["profile"] for t in targets} - {UNKNOWN})
    jobs = write_out.write(out, targets, interval=interval, profiles=bounds)
    if as_json:
        print_json(0, out=str(out.resolve()), jobs={job: [t["targets"][0] for t in doc] for job, doc in jobs.items()},
                   profile_alerts=sorted(bounds), profiles_not_found=unknown)
        return
    for name in unknown:
        typer.echo(f"note: profile {name} is not found here: its own alert bounds are not rendered", err=True)
    for job, doc in sorted(jobs.items()):
        for entry in doc:
            labels = entry["labels"]
            typer.echo(f"{job}: {entry['targets'][0]} {labels['host']} {labels['unit']} "
                       f"({labels['profile']}, {labels['runtime']}, {labels['method']}, {labels['role']})")
    typer.echo(f"wrote {out.resolve()}: add scrape.yml's entries to scrape_configs and rules/ddops.yml to "
               "rule_files in prometheus.yml; import dashboard.json into Grafana")


def monitoring_of(names: set[str]) -> tuple[dict, list[str]]:
    """The deployed profiles' own alert bounds (those that set any), and the names not found here."""
    from ddops.profile import load_profile
    from ddops.profile.yamlfile import ConfigError
    bounds, unknown = {}, []
    for name in sorted(names):
        try:
            spec = load_profile(name).monitoring
        except (ConfigError, ValueError):
            unknown.append(name)
            continue
        if spec.ttft_p99_slo_s is not None or spec.break_even_accept_length is not None:
            bounds[name] = spec
    return bounds, unknown
