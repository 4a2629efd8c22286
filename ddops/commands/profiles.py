"""`ddops profiles | show | validate | render`: read-only commands on profiles.

Bad input exits 2 with one line per problem (file, key, line, reason) and a hint;
tracebacks only with --debug.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.table import Table

from ddops import exits
from ddops.fit.checks import check_hosts
from ddops.fit.profile_fit import local_reader
from ddops.inventory import find_inventory, load_inventory
from ddops.profile import ConfigError, Profile, list_profiles, load_profile, profiles_dir
from ddops.profile.annotate import annotated_yaml, sources
from ddops.profile.rules import exposures
from ddops.profile.yamlfile import problem
from ddops.render import Rendered, render
from ddops.shell import print_json

out = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False, soft_wrap=True)

ProfilesDir = Annotated[Optional[Path], typer.Option(
    "--profiles-dir", envvar="DDOPS_PROFILES", help="Folder of profile YAML files.")]
InventoryOpt = Annotated[Optional[Path], typer.Option(
    "--inventory", "-i", envvar="DDOPS_INVENTORY", help="Inventory file.")]
JsonOpt = Annotated[bool, typer.Option("--json", help="One JSON document on stdout.")]
HINT = "hint: fix the lines above, then `ddops validate`; `ddops show PROFILE` prints what a profile resolves to"
DebugOpt = Annotated[bool, typer.Option("--debug", help="Show tracebacks (same as the global --debug).")]


def cmd_profiles(profiles_dir_: ProfilesDir = None, as_json: JsonOpt = False,
                 debug: DebugOpt = False) -> None:
    """List the profiles with their runtime, method and model."""
    rows = [_summary(name, profiles_dir_) for name in list_profiles(profiles_dir_)]
    if as_json:
        print_json(exits.OK, profiles=rows)
        return
    table = Table(title=f"profiles in {profiles_dir(profiles_dir_)}")
    for column in ("profile", "runtime", "method", "model", "extends"):
        table.add_column(column, no_wrap=column == "profile", overflow="fold")
    table.add_column("description", ratio=1)
    for row in rows:
        table.add_row(*(str(row[k] or "") for k in ("name", "runtime", "method", "model",
                                                    "extends", "description")))
    out.print(table)
    if any(row["problems"] for row in rows):
        err.print("some profiles are invalid: `ddops validate` lists the problems", style="yellow")


def _summary(name: str, folder: Path | None) -> dict:
    try:
        profile = load_profile(name, folder)
    except ConfigError as exc:
        return dict(name=name, runtime=None, method=None, model=None, extends=None,
                    description="INVALID", problems=exc.problems)
    return dict(name=name, runtime=profile.runtime, method=profile.speculative.algorithm,
                model=profile.model.served_name, extends=profile.extends,
                description=profile.description, problems=[])


def cmd_show(profile: Annotated[str, typer.Argument(help="Profile name or YAML path.")],
             profiles_dir_: ProfilesDir = None, as_json: JsonOpt = False,
             debug: DebugOpt = False) -> None:
    """Print the fully resolved profile, each value with the file it came from."""
    resolved = load_profile(profile, profiles_dir_)
    if as_json:
        print_json(exits.OK, profile=resolved.model_dump(mode="json"), files=list(resolved.files),
                   sources=sources(resolved))
        return
    chain = " <- ".join(resolved.files)
    out.print(f"# {resolved.name}: resolved from {chain}", markup=False, style="dim")
    print(annotated_yaml(resolved), end="")


def cmd_validate(profiles: Annotated[Optional[list[str]], typer.Argument(
                     help="Profiles to check (default: all).")] = None,
                 profiles_dir_: ProfilesDir = None, inventory: InventoryOpt = None,
                 models: Annotated[Optional[Path], typer.Option(
                     "--models", envvar="DDOPS_FIT_MODELS",
                     help="Local model copies (DIR/<basename>) for the memory-fit warnings.")] = None,
                 as_json: JsonOpt = False, debug: DebugOpt = False) -> None:
    """Check profiles and the inventory; exit 2 if anything is wrong. Warns (exit 0) when a
    profile is predicted not to fit the GPUs the inventory's hosts declare."""
    names = profiles or list_profiles(profiles_dir_)
    # Rendering too: a profile is only valid if its unit can be written.
    results = {name: _problems(lambda n=name: render(load_profile(n, profiles_dir_)))
               for name in names}
    inv_path = find_inventory(inventory)
    inv = {"path": str(inv_path) if inv_path else None,
           "problems": _problems(lambda: load_inventory(inv_path)) if inv_path else []}
    ok = not any(results.values()) and not inv["problems"]
    warnings, notes = _fit_warnings(names, results, profiles_dir_, inv_path, inv, models)
    for name in (n for n in names if not results[n]):
        warnings.setdefault(name, []).extend(_exposure_warnings(load_profile(name, profiles_dir_)))
    if as_json:
        print_json(exits.OK if ok else exits.BAD_INPUT,
                   error=None if ok else "profiles or inventory have problems (listed per file)",
                   profiles={n: {"ok": not p, "problems": p, "warnings": warnings.get(n, [])}
                             for n, p in results.items()},
                   inventory={**inv, "ok": not inv["problems"]}, notes=notes)
    else:
        _print_validation(results, inv)
        for line in [w for ws in warnings.values() for w in ws]:
            err.print(f"warning: {line}", markup=False, style="yellow")
        for line in notes:
            err.print(f"note: {line}", markup=False, style="dim")
    if not ok:
        raise typer.Exit(2)


def _exposure_warnings(profile: Profile) -> list[str]:
    """`<profile>: <file that set it>: <key>: <reason>` per exposure (rules.exposures)."""
    def file_of(key: str) -> str:
        source = profile.source_of(key)
        return source if source != "default" else profile.files[0]
    return [f"{profile.name}: {problem(file_of(key), key, reason)}" for key, reason in exposures(profile)]


def _fit_warnings(names, results, folder, inv_path, inv, models) -> tuple[dict[str, list[str]], list[str]]:
    """Per valid profile, one warning per inventory GPU declaration it is predicted not to fit."""
    if not inv_path or inv["problems"]:
        return {}, []
    hosts = list(load_inventory(inv_path).hosts.values())
    warnings, skipped = {}, []
    for name in (n for n in names if not results[n]):
        checks, notes = check_hosts(load_profile(name, folder), hosts, local_reader(models))
        warnings[name] = [c.line(name) for c in checks if not c.fits]
        skipped += notes
    if len(skipped) > 1:  # the same missing model folder, once
        skipped = [f"fit not checked for {len(skipped)} profiles; first: {skipped[0]}"]
    return warnings, skipped


def _problems(load) -> list[str]:
    try:
        load()
    except ConfigError as exc:
        return exc.problems
    return []


def _print_validation(results: dict[str, list[str]], inv: dict) -> None:
    table = Table(title="validate")
    table.add_column("what")
    table.add_column("result")
    for name, problems in results.items():
        table.add_row(name, "[green]ok[/]" if not problems else f"[red]{len(problems)} problem(s)[/]")
    inv_label = f"inventory {inv['path']}" if inv["path"] else "inventory"
    inv_result = ("[dim]none found (skipped)[/]" if not inv["path"] else
                  "[green]ok[/]" if not inv["problems"] else f"[red]{len(inv['problems'])} problem(s)[/]")
    table.add_row(inv_label, inv_result)
    out.print(table)
    for line in [p for ps in results.values() for p in ps] + inv["problems"]:
        err.print(line, markup=False)
    if any(results.values()) or inv["problems"]:
        err.print(HINT, markup=False, style="dim")


def cmd_render(profile: Annotated[str, typer.Argument(help="Profile name or YAML path.")],
               host: Annotated[Optional[str], typer.Option(
                   "--host", help="Check the profile against this inventory host.")] = None,
               out_dir: Annotated[Optional[Path], typer.Option(
                   "--out", help="Write the unit and env file here instead of stdout.")] = None,
               unit_name: Annotated[Optional[str], typer.Option(
                   "--unit", "--unit-name", help="Override the unit name (e.g. llm-shadow).")] = None,
               port: Annotated[Optional[int], typer.Option(
                   "--port", min=1, max=65535, help="Override the port.")] = None,
               profiles_dir_: ProfilesDir = None, inventory: InventoryOpt = None,
               as_json: JsonOpt = False, debug: DebugOpt = False) -> None:
    """Render the systemd unit and env file (secrets are never resolved here)."""
    resolved = load_profile(profile, profiles_dir_)
    target = load_inventory(inventory).host(host) if host else None
    rendered = render(resolved, target, unit_name=unit_name, port=port)
    if out_dir is not None:
        _write(rendered, out_dir, as_json)
    elif as_json:
        print_json(exits.OK, **_as_dict(rendered))
    else:
        print(f"# --- {rendered.unit_path} ---\n{rendered.unit_text}", end="")
        print(f"# --- {rendered.env_path} (mode 0600) ---\n{rendered.env_text}", end="")


def _as_dict(rendered: Rendered) -> dict:
    return {k: getattr(rendered, k) for k in ("unit_name", "unit_path", "unit_text", "env_path",
                                              "env_text", "argv", "content_hash")}


def _write(rendered: Rendered, out_dir: Path, as_json: bool) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    unit_file = out_dir / rendered.unit_name
    env_file = out_dir / Path(rendered.env_path).name
    unit_file.write_text(rendered.unit_text, encoding="utf-8")
    fd = os.open(env_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(rendered.env_text)
    os.chmod(env_file, 0o600)
    if as_json:
        print_json(exits.OK, unit_file=str(unit_file), env_file=str(env_file),
                   content_hash=rendered.content_hash)
    else:
        out.print(f"wrote {unit_file}\nwrote {env_file} (mode 0600)", markup=False)


def register(app: typer.Typer) -> None:
    app.command("profiles")(cmd_profiles)
    app.command("show")(cmd_show)
    app.command("validate")(cmd_validate)
    app.command("render")(cmd_render)
