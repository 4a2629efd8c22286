"""`ddops preflight PROFILE [--host NAME]`: check a profile's files before starting anything.

Model directories exist; for methods that need a draft (METHODS capability), the draft fits
the target (ddops.preflight); no flag the runtime would refuse once it reads the target
(ddops.fit.start_rules: --max-total-tokens where the bundled runtime has no pool); with
--host, every flag of the rendered command line is one the host's installed runtime knows
(its own --help, so renamed SGLang flags are caught), and the host's installed build can load
the target and draft (ddops.deploy.draft_load: head sizes, the draft's mask token)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape

from ddops import exits
from ddops.deploy import show
from ddops.deploy.draft_load import load_refusals, pairing_kept
from ddops.deploy.refusals import unknown_flags
from ddops.fit.model import ModelFactsError
from ddops.fit.read import read_model
from ddops.fit.start_rules import profile_refusals
from ddops.inventory import load_inventory
from ddops.draft_pairing import (LocalFiles, PreflightError, Problem, RemoteFiles, check_model_dir,
                             check_pair, read_pair)
from ddops.profile import load_profile
from ddops.profile.runtimes import RUNTIMES
from ddops.profile.yamlfile import ConfigError
from ddops.remote import connect
from ddops.render import command_line
from ddops.shell import print_json


def register(app: typer.Typer) -> None:
    app.command("preflight")(preflight)


def preflight(profile: str = typer.Argument(..., help="profile name or YAML path"),
              host: Optional[str] = typer.Option(None, "--host", help="read the files on this host"),
              models: Optional[Path] = typer.Option(
                  None, "--models", help="check local copies: DIR/<basename of each model path>"),
              as_json: bool = typer.Option(False, "--json", help="print one JSON document"),
              profiles_dir: Optional[Path] = typer.Option(None, "--profiles-dir"),
              inventory: Optional[Path] = typer.Option(None, "--inventory", "-i")) -> None:
    """Draft/target config check and flag check; starts nothing. Exit 0 fits, 2 does not, 6 the
    host cannot be reached."""
    try:
        prof = load_profile(profile, profiles_dir)
        target = load_inventory(inventory).host(host) if host else None
    except ConfigError as err:
        _finish(as_json, profile, host, [Problem("profile", str(err))])
    argv = command_line(prof)
    try:
        if target is None:
            problems = check_profile(prof, LocalFiles(), models)
        else:
            with connect(target) as remote:
                problems = (check_profile(prof, RemoteFiles.of(remote)) + check_flags(remote, argv)
                            + check_load(remote, argv))
    except PreflightError as err:     # an unreachable host is not a problem of the profile: exit 6
        problems = [Problem("files", str(err))]
    _finish(as_json, prof.name, host, problems)


def check_profile(prof, files, models: Path | None = None) -> list[Problem]:
    where = (lambda p: str(models / Path(p).name)) if models else (lambda p: p)  # noqa: E731
    target = where(prof.model.path)
    problems = check_model_dir(files, target, "target")
    draft = prof.speculative.draft_model_path
    if prof.method.needs_draft and draft:
        problems += check_model_dir(files, where(draft), "draft")
        if not problems:
            found = check_pair(read_pair(files, target, where(draft)), prof.speculative.block_size,
                               prof.speculative.ddtree_budget)
            problems += pairing_kept(RUNTIMES[prof.runtime], found)
    if problems:
        return problems
    try:
        refused = profile_refusals(prof, lambda path: read_model(files, where(path)))
    except ModelFactsError as err:
        return [Problem("target model", str(err))]
    return [Problem("sglang.extra_args", line) for line in refused]


def check_flags(remote, argv: list[str]) -> list[Problem]:
    """Every --flag in argv appears in the installed runtime's --help."""
    return [Problem("flag", line) for line in unknown_flags(remote, argv)]


def check_load(remote, argv: list[str]) -> list[Problem]:
    """The host's installed build can load the target and draft (head sizes, mask token)."""
    return [Problem("load", line) for line in load_refusals(remote, argv)]


def _finish(as_json: bool, profile: str, host: str | None, problems: list[Problem]) -> None:
    code = exits.BAD_INPUT if problems else exits.OK
    if as_json:
        print_json(code, error=f"{len(problems)} problem(s)" if problems else None, profile=profile, host=host,
                   problems=[{"key": p.key, "reason": p.reason} for p in problems])
        raise typer.Exit(code)
    where = f"on {host}" if host else "locally"
    for p in problems:
        show.console.print(f"[red]problem[/red] {escape(str(p))}")
    if problems:
        show.console.print(f"[red]{profile}: preflight failed {where}[/red] ({len(problems)} problem(s))")
    else:
        show.console.print(f"[green]{profile}: preflight passed {where}[/green]")
    raise typer.Exit(code)
