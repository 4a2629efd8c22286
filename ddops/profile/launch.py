"""A unit's command line read back into profile keys, by the same flag tables that wrote it.

The gate, the planning checks, adopt and rollback read what a unit will run from its ExecStart
(a history entry or a hand-written unit has no profile). Each runtime's table says which flag
(and which older aliases) carries a key, and which keys travel inside one JSON argument
(vLLM's --speculative-config), so no reader spells a flag of its own.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from ddops.profile.methods import METHODS
from ddops.profile.runtimes import RUNTIMES, Runtime


@dataclass(frozen=True)
class Launch:
    runtime: str | None            # RUNTIMES key, None when the module is none of theirs
    values: dict[str, str] = field(default_factory=dict)   # dotted key -> value as written
    method: str | None = None      # METHODS key of the speculative method, None when plain/unknown

    def get(self, key: str) -> str | None:
        return self.values.get(key)

    def int(self, key: str) -> int | None:
        value = self.values.get(key)
        return int(value) if value is not None and value.lstrip("-").isdigit() else None

    @property
    def table(self) -> Runtime | None:
        return RUNTIMES.get(self.runtime) if self.runtime else None


def runtime_named(argv: list[str]) -> str | None:
    """The RUNTIMES key whose module `argv` runs (`python -m MODULE ...`), or None."""
    if len(argv) < 3 or argv[1] != "-m":
        return None
    return next((name for name, r in RUNTIMES.items() if r.module == argv[2]), None)


def read_launch(argv: list[str]) -> Launch:
    """Profile keys from a command line; an unknown runtime reads every table's spellings."""
    name = runtime_named(argv)
    tables = [RUNTIMES[name]] if name else list(RUNTIMES.values())
    values: dict[str, str] = {}
    for table in tables:
        for key, value in _values(table, argv).items():
            values.setdefault(key, value)
    return Launch(name, values, _method(tables, values))


def _values(table: Runtime, argv: list[str]) -> dict[str, str]:
    found: dict[str, str] = {}
    for flag in table.flags:
        if not flag.flag or flag.style in ("switch", "off_switch"):
            continue
        raw = _last_value(argv, (flag.flag, *flag.aliases))
        if raw is None:
            continue
        if flag.style != "json":
            found[flag.key] = raw
            continue
        fields = _json_object(raw)
        if flag.field in fields:
            value = fields[flag.field]
            found[flag.key] = str(value - flag.offset if isinstance(value, int) else value)
    return found


def _method(tables: list[Runtime], values: dict[str, str]) -> str | None:
    spelled = values.get("speculative.algorithm")
    if spelled is None:
        return None
    for table in tables:
        for key, method in METHODS.items():
            name = table.method_name(method)
            if name is not None and name.lower() == spelled.strip().lower():
                return key
    return None


def _last_value(argv: list[str], names: tuple[str, ...]) -> str | None:
    """The value of the last `--flag V` or `--flag=V` among `names` (argparse keeps the last)."""
    found = None
    for i, arg in enumerate(argv):
        if arg in names and i + 1 < len(argv):
            found = argv[i + 1]
        elif "=" in arg and arg.split("=", 1)[0] in names:
            found = arg.split("=", 1)[1]
    return found


def _json_object(raw: str) -> dict:
    try:
        value = json.loads(raw)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}
