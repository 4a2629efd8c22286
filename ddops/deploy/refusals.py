"""What can be known about a change before anything on the host starts: the planning checks.

Every mutating command (deploy, rollback, switch, shadow start, each rollout host) reaches the
host through `execute`, which feeds these findings into the plan; a plan with refusals stops
with exit 2 before the host changes, unless forced (then the history entry records them).

Read from the unit's own command line (so a rollback to a history entry is checked the same
way as a fresh profile) and the host's files:
  model-missing / draft-missing  the directory (its config.json) is not on the host
  draft-target                   ddops.preflight's pair check (fc width, tapped layers, mask id)
  load                           a head size the host's installed build has no kernel for, or a
                                 draft without the mask token the runtime reads (draft_load.py)
  unreadable                     a config or safetensors header that cannot be parsed
  runtime                        the unit's interpreter/module cannot run `--help` on the host
  flag                           a flag the installed runtime's own --help does not list, or one
                                 it refuses once it reads the target (ddops.fit.start_rules:
                                 --max-total-tokens on a speculative hybrid, bundled runtime)
  fit                            predicted not to fit the host's GPUs (needs the profile)
  port                           the unit's port is held by a process of no ddops unit: the
                                 runtime would fail to bind it (`[Errno 98] address already in
                                 use`). A ddops unit holding it (the one this change replaces, or
                                 one a switch stops first) is the plan's business, not a refusal.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

from ddops.deploy.desired import unit_argv
from ddops.deploy.draft_load import load_refusals, pairing_kept
from ddops.checkpoint import read_config
from ddops.fit.model import ModelFactsError, facts_from_config
from ddops.fit.start_rules import POOL_FLAG, applies, refused
from ddops.draft_pairing import PreflightError, RemoteFiles, check_model_dir, check_pair, read_pair
from ddops.profile import method_for
from ddops.profile.launch import read_launch
from ddops.profile.extra_args import values_of


@dataclass(frozen=True)
class Refusal:
    check: str      # model-missing | draft-missing | draft-target | load | unreadable | runtime | flag | fit | port
    reason: str

    def __str__(self) -> str:
        return f"{self.check}: {self.reason}"

    def as_dict(self) -> dict:
        return {"check": self.check, "reason": self.reason}


def refusals(remote, unit_text: str, profile=None, unit: str | None = None) -> list[Refusal]:
    """Every definite reason the unit cannot start on this host; empty when none is known."""
    argv = unit_argv(unit_text)
    if not argv:
        return []
    found = _file_refusals(RemoteFiles.of(remote), argv)
    found += [Refusal("load", reason) for reason in load_refusals(remote, argv)]
    runtime_ok = not isinstance(known_flags(remote, runtime_of(argv)), str)
    found += [Refusal("flag" if runtime_ok else "runtime", reason) for reason in unknown_flags(remote, argv)]
    found += port_refusals(remote, argv, unit)
    if profile is not None:
        found += _fit_refusals(remote, profile, unit)
    return found


# Each process listening on the port: "<pid> <systemd unit or -> <ddops|other> <command>" (one
# SSH round); a unit is ddops's when its file carries the header render writes.
_HOLDERS = ("ss -Hltnp 'sport = :{port}' 2>/dev/null | grep -o 'pid=[0-9]*' | cut -d= -f2 | sort -u | "
            "while read p; do u=$(grep -o '[^/]*\\.service' /proc/$p/cgroup 2>/dev/null | tail -n1); "
            "f=/etc/systemd/system/$u; grep -qs '^# ddops-profile:' \"$f\" && d=ddops || d=other; "
            "echo \"$p ${{u:--}} $d $(cat /proc/$p/comm 2>/dev/null)\"; done")


def port_refusals(remote, argv: list[str], unit: str | None) -> list[Refusal]:
    port = read_launch(argv).int("service.port")
    if port is None:
        return []
    lines = remote.run(_HOLDERS.format(port=port), check=False).stdout.split("\n")
    holders = [line.split(maxsplit=3) for line in lines if len(line.split(maxsplit=3)) == 4]
    return [Refusal("port", f"port {port} is held by {command} (pid {pid}, "
                    f"{'unit ' + held if held != '-' else 'no unit'}): the runtime would fail to bind it; "
                    "stop that process or deploy with another --port")
            for pid, held, kind, command in holders if kind == "other" and held != unit]


def _file_refusals(files, argv: list[str]) -> list[Refusal]:
    launch = read_launch(argv)
    target = launch.get("model.path")
    draft = launch.get("speculative.draft_model_path")
    found = [Refusal("model-missing", str(p)) for p in check_model_dir(files, target, "target")] if target else []
    if draft:
        found += [Refusal("draft-missing", str(p)) for p in check_model_dir(files, draft, "draft")]
    if target and not found:
        found += _start_refusals(files, argv, target)
    if target and draft and not found:
        block, budget = launch.int("speculative.block_size"), launch.int("speculative.ddtree_budget")
        try:
            pair = read_pair(files, target, draft)
            kept = pairing_kept(launch.table, check_pair(pair, block, budget))
            found += [Refusal("draft-target", str(p)) for p in kept]
        except (PreflightError, KeyError, ValueError) as err:
            found.append(Refusal("unreadable", str(err)))
    return found


def _start_refusals(files, argv: list[str], target: str) -> list[Refusal]:
    """A flag the unit's runtime refuses at start for this target, known from its config.json."""
    launch = read_launch(argv)
    runtime, values = launch.table, values_of(argv, POOL_FLAG)
    speculative = launch.method is not None and method_for(launch.method).is_speculative
    try:
        max_total = int(values[-1]) if values and values[-1] else None
    except ValueError:
        return []       # the runtime's own argument parser names these
    if runtime is None or not applies(runtime, speculative, max_total):
        return []
    try:
        facts = facts_from_config(read_config(files, target), target)
    except (PreflightError, ModelFactsError) as err:
        return [Refusal("unreadable", str(err))]
    return [Refusal("flag", line) for line in refused(runtime, facts, speculative, max_total)]


def _fit_refusals(remote, profile, unit: str | None) -> list[Refusal]:
    from ddops.fit.checks import check_on_host
    fit = check_on_host(profile, remote.host, remote, unit)
    if fit is None or fit.fits:
        return []
    return [Refusal("fit", fit.line(profile.name))]


def runtime_of(argv: list[str]) -> list[str]:
    """The interpreter part of a command line: `python -m module` or a single executable."""
    return argv[:3] if len(argv) >= 3 and argv[1] == "-m" else argv[:1]


def known_flags(remote, runtime: list[str]) -> set[str] | str:
    """The flags the host's runtime lists in --help (cached per connection), or why not."""
    cache = remote.cache.setdefault("help", {})
    key = tuple(runtime)
    if key not in cache:
        command = " ".join(shlex.quote(a) for a in runtime)
        result = remote.run(f"{command} --help", check=False, timeout=180)
        if result.ok:
            cache[key] = set(re.findall(r"--[A-Za-z0-9][A-Za-z0-9_-]*", result.stdout))
        else:
            tail = (result.stderr or result.stdout).strip()[-200:]
            cache[key] = f"`{command} --help` exited {result.exit_code} on the host: {tail}"
    return cache[key]


def unknown_flags(remote, argv: list[str]) -> list[str]:
    """One line per flag of argv the installed runtime does not know (or why it cannot run)."""
    runtime = runtime_of(argv)
    known = known_flags(remote, runtime)
    if isinstance(known, str):
        return [known]
    name = " ".join(runtime)
    return [f"{flag} is not accepted by the installed runtime ({name})"
            for flag in argv[len(runtime):] if flag.startswith("--") and flag.split("=")[0] not in known]
