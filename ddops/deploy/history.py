"""Deploy history, kept on the host: history/<unit>/NNNN-<timestamp>/ holding the unit file,
the env file (0600) with each secret replaced by its fingerprint, and meta.json (profile, hash,
result, gate spec, diagnosis, secret fingerprints). Entry ids are the NNNN part; they only grow.

History is kept forever, so it never holds a secret: a rollback takes the key from the env
file the host has now (the key clients use now) and says so when its fingerprint differs."""

from __future__ import annotations

import hashlib
import json
import re
import shlex
import time
from dataclasses import dataclass

from ddops.deploy.facts import history_dir
from ddops.profile.rules import API_KEY_VARS
from ddops.unitsyntax import env_value, parse_env

SECRET_VARS = API_KEY_VARS  # what ddops writes from service.secrets
WITHHELD = re.compile(r"^# (\w+)=<withheld, (sha256:[0-9a-f]+)>$", re.MULTILINE)


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


def next_dirname(existing: tuple[str, ...], now: float, number: int | None = None) -> str:
    """NNNN-<UTC time>: the next number, or `number` (0 is an adopted unit, see adopt.py)."""
    numbers = [int(d.split("-", 1)[0]) for d in existing if d.split("-", 1)[0].isdigit()]
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(now))
    return f"{max(numbers, default=0) + 1 if number is None else number:04d}-{stamp}"


def record(remote, unit_name: str, existing: tuple[str, ...], unit_text: str, env_text: str,
           meta: dict, number: int | None = None) -> Entry:
    env_kept, prints = withhold_secrets(env_text)
    entry = Entry(unit_name, next_dirname(existing, time.time(), number), {**meta, "secrets": prints})
    remote.write(f"{entry.path}/unit", unit_text)
    remote.write(f"{entry.path}/env", env_kept, mode=0o600)
    remote.write(f"{entry.path}/meta.json", json.dumps(entry.meta, indent=1, sort_keys=True))
    return entry


def fingerprint(value: str) -> str:
    """Tells two keys apart without keeping either (64 bits of SHA-256)."""
    return "sha256:" + hashlib.sha256(value.encode()).hexdigest()[:16]


def withhold_secrets(env_text: str) -> tuple[str, dict[str, str]]:
    """The env file with each secret line replaced by a comment naming its fingerprint."""
    values = parse_env(env_text)
    prints = {name: fingerprint(values[name]) for name in SECRET_VARS if name in values}
    lines = []
    for line in env_text.split("\n"):
        name = line.partition("=")[0].strip()
        lines.append(f"# {name}=<withheld, {prints[name]}>" if name in prints and "=" in line
                     and not line.lstrip().startswith("#") else line)
    return "\n".join(lines), prints


class SecretMissing(Exception):
    """A history entry needs a secret the host's current env file does not hold."""


def restore_secrets(env_kept: str, env_now: str | None) -> str:
    """Fill withheld secrets from the host's current env file (a rotated key stays rotated). The
    API key is the unit's whichever runtime reads it: an entry of another runtime (DDOPS_API_KEY
    for the bundled runtime, VLLM_API_KEY for vLLM) takes it from the variable the unit has now."""
    current = parse_env(env_now or "")
    key_now = next((current[name] for name in SECRET_VARS if name in current), None)

    def fill(match: re.Match) -> str:
        name, print_ = match.group(1), match.group(2)
        value = current.get(name, key_now if name in SECRET_VARS else None)
        if value is None:
            raise SecretMissing(f"{name} ({print_}) is not in the host's env file now; "
                                "deploy the profile instead, with the key")
        return f"{name}={env_value(value)}"

    return WITHHELD.sub(fill, env_kept)


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
    unit, env = remote.read_all(f"{entry.path}/unit", f"{entry.path}/env")
    if unit is None or env is None:
        raise FileNotFoundError(f"{remote.label}: {entry.path}: unit or env file missing from the entry")
    return unit.decode(), env.decode()
