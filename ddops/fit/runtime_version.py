"""Which SGLang a host runs, and whether a profile's command line suits it.

`ddops fit --host` reads the installed version from the package metadata of the unit's own
interpreter (no `import sglang`: that takes seconds and a GPU runtime). A build carrying
DDTree's PR is recognised by its `ddtree` files and reported as `<version>+ddtree`.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from ddops.profile import RUNTIMES, Profile
from ddops.profile.sglang_versions import VersionError, deprecations, flags_for, unknown_flags
from ddops.render import command_line

PROBE = ("import importlib.metadata as m\n"
         "try:\n d = m.distribution('sglang')\nexcept m.PackageNotFoundError:\n print('absent'); raise SystemExit\n"
         "print(d.version)\n"
         "print(any('ddtree' in str(f) for f in (d.files or ())))\n")


@dataclass(frozen=True)
class FlagCheck:
    host_version: str | None  # None: SGLang is not installed for the unit's interpreter
    declared: str | None
    problems: tuple[str, ...]  # the launch would fail on these
    notes: tuple[str, ...]  # deprecations, a declared version that differs


def installed_version(remote, python: str) -> str | None:
    result = remote.run(f"{shlex.quote(python)} -c {shlex.quote(PROBE)}", check=False, timeout=60)
    return parse_probe(result.stdout) if result.ok else None


def parse_probe(stdout: str) -> str | None:
    lines = stdout.split()
    if not lines or lines[0] == "absent":
        return None
    return lines[0] + ("+ddtree" if len(lines) > 1 and lines[1] == "True" and "+" not in lines[0] else "")


def check_flags(profile: Profile, host_version: str | None) -> FlagCheck | None:
    """The rendered flags against the host's SGLang; None for runtimes without versioned flags."""
    if not RUNTIMES[profile.runtime].versioned_flags:
        return None
    declared = profile.sglang_version
    if host_version is None:
        return FlagCheck(None, declared, ("SGLang is not installed for " + profile.service.python,), ())
    try:
        flags = flags_for(host_version)
    except VersionError as exc:
        return FlagCheck(host_version, declared, (), (f"host SGLang {exc}; flags not checked",))
    argv = [a for a in command_line(profile)[3:] if a.startswith("--")]
    problems = unknown_flags(flags, argv)
    name = profile.method.sglang_name
    if name is not None and name not in flags.algorithms:
        problems.append(f"SGLang {host_version} on the host has no --speculative-algorithm {name}")
    notes = deprecations(flags, argv)
    if declared and declared != host_version:
        notes.append(f"profile declares sglang_version {declared}, the host runs {host_version}")
    return FlagCheck(host_version, declared, tuple(problems), tuple(notes))
