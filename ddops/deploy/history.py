"""Deploy history, kept on the host: history/<unit>/NNNN-<timestamp>/ holding the unit file,
the env file (0600), and meta.json (profile, hash, result, gate spec, diagnosis).
Entry ids are the NNNN part; they only grow."""

from __future__ import annotations

import json
import shlex
import time
from dataclasses import dataclass

from ddops.deploy.facts import history_dir


@dataclass(frozen=True)
class Entry:
    unit_name: str
    dirname: str        # NNNN-YYYYmmddTHHMMSSZ
    meta: dict

    @property
    def id(self) -> str:
        return self.dirname.split("-", 1)[0]

    @property
    def path(self) -> str:
        return f"{history_dir(self.unit_name)}/{self.dirname}"

    def as_dict(self) -> dict:
        return {"id": self.id, "unit": self.unit_name, **self.meta}


def next_dirname(existing: tuple[str, ...], now: float) -> str:
    numbers = [int(d.split("-", 1)[0]) for d in existing if d.split("-", 1)[0].isdigit()]
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(now))
    return f"{max(numbers, default=0) + 1:04d}-{stamp}"


def record(remote, unit_name: str, existing: tuple[str, ...], unit_text: str, env_text: str,
           meta: dict) -> Entry:
    entry = Entry(unit_name, next_dirname(existing, time.time()), meta)
    remote.write(f"{entry.path}/unit", unit_text)
    remote.write(f"{entry.path}/env", env_text, mode=0o600)
    remote.write(f"{entry.path}/meta.json", json.dumps(meta, indent=1, sort_keys=True))
    return entry


def update_result(remote, entry: Entry, **fields) -> Entry:
    meta = {**entry.meta, **fields}
    remote.write(f"{entry.path}/meta.json", json.dumps(meta, indent=1, sort_keys=True))
    return Entry(entry.unit_name, entry.dirname, meta)


def entries(remote, unit_name: str | None = None) -> list[Entry]:
    """All entries on the host (or of one unit), oldest first within each unit."""
    root = history_dir(unit_name) if unit_name else history_dir("")
    pattern = f"{shlex.quote(root)}/*/meta.json" if unit_name else f"{shlex.quote(root)}*/*/meta.json"
    script = (f"for f in {pattern}; do [ -f \"$f\" ] || continue; "
              f"printf '@@%s\\n' \"$f\"; cat \"$f\"; echo; done")
    found = []
    for chunk in remote.run(script).stdout.split("@@")[1:]:
        path, _, body = chunk.partition("\n")
        parts = path.split("/")
        found.append(Entry(parts[-3], parts[-2], json.loads(body)))
    return sorted(found, key=lambda e: (e.unit_name, e.dirname))


def files(remote, entry: Entry) -> tuple[str, str]:
    unit = remote.read(f"{entry.path}/unit")
    env = remote.read(f"{entry.path}/env")
    if unit is None or env is None:
        raise FileNotFoundError(f"{remote.label}: {entry.path}: unit or env file missing from the entry")
    return unit.decode(), env.decode()
