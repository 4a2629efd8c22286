"""Deploy history, kept on the host: history/<unit>/NNNN-<timestamp>/ holding the unit file,
the env file (0600) with each secret replaced by its fingerprint, and meta.json: one `Record`
(profile, hash, result, gate spec, gate report, diagnosis, secret fingerprints). Entry ids are
the NNNN part; they only grow.

History is kept forever, so it never holds a secret: a rollback takes the key from the env
file the host has now (the key clients use now) and says so when its fingerprint differs."""

from __future__ import annotations

import hashlib
import json
import re
import shlex
import time
from dataclasses import asdict, dataclass, field, fields, replace

from ddops.deploy.facts import history_dir
from ddops.deploy.gate import GateSpec
from ddops.profile.rules import API_KEY_VARS
from ddops.remote import framing
from ddops.unitsyntax import env_value, parse_env

SECRET_VARS = API_KEY_VARS  # what ddops writes from service.secrets
WITHHELD = re.compile(r"^# (\w+)=<withheld, (sha256:[0-9a-f]+)>$", re.MULTILINE)


@dataclass(frozen=True)
class Record:
    """One entry's meta.json: what was deployed, by whom, and how it ended."""
    profile: str                # profile name ("?" when unknown; adopt: "<unit> (hand-written)")
    hash: str                   # the rendered files' content hash (adopt: adopted-<sha256>)
    unit: str
    unit_path: str
    env_path: str
    holder: dict | None         # lock.Holder.as_dict() of the command that wrote it
    started: float              # epoch seconds
    finished: float
    result: str                 # passed | failed | failed-reverted | revert-failed | killed-recovered | adopted | unreadable
    gate_spec: GateSpec | None = None   # what a rollback to this entry is gated with
    gate: dict | None = None            # GateReport.as_dict()
    diagnosis: tuple[dict, ...] = ()    # Finding.as_dict() of the failed start's journal
    forced: tuple[dict, ...] = ()       # Refusal.as_dict() of the checks --force overrode
    revert: str | None = None           # what a revert after a failed gate left, in words
    returns_to: str | None = None       # a rollback: the entry it went back to (ops.previous_good)
    secrets: dict = field(default_factory=dict)     # variable -> fingerprint (never the value)

    @classmethod
    def of(cls, desired, holder: dict | None, started: float, result: str, **details) -> "Record":
        """The one builder: a deploy's gate, a killed deploy found by the next and an adopted
        unit all record through it. desired: plan.Desired (unit, paths, profile, hash)."""
        return cls(desired.profile, desired.profile_hash, desired.unit_name, desired.unit_path,
                   desired.env_path, holder, started, time.time(), result, **details)

    def as_dict(self) -> dict:
        return {**asdict(self), "gate_spec": self.gate_spec.as_dict() if self.gate_spec else None}

    def to_json(self) -> str:
        return json.dumps(self.as_dict(), indent=1, sort_keys=True)

    @classmethod
    def from_json(cls, text: bytes | str, unit: str) -> "Record":
        """A meta.json as written by any ddops (missing keys take their defaults); one that does
        not parse is listed as `unreadable` rather than hiding the rest of the history."""
        try:
            data = json.loads(text)
            known = {f.name for f in fields(cls)}
            values = {k: v for k, v in data.items() if k in known}
            spec = values.get("gate_spec")
            values["gate_spec"] = GateSpec.from_dict(spec) if spec else None
            values.update({k: tuple(values.get(k) or ()) for k in ("diagnosis", "forced")})
            return cls(**{"profile": "?", "hash": "", "unit": unit, "unit_path": "", "env_path": "",
                          "holder": None, "started": 0.0, "finished": 0.0, "result": "?", **values})
        except (ValueError, TypeError, AttributeError) as err:
            return cls("?", "", unit, "", "", None, 0.0, 0.0, "unreadable", revert=f"meta.json: {err}")


@dataclass(frozen=True)
class Entry:
    unit_name: str
    dirname: str        # NNNN-YYYYmmddTHHMMSSZ
    record: Record

    @property
    def id(self) -> str:
        return self.dirname.split("-", 1)[0]

    @property
    def path(self) -> str:
        return f"{history_dir(self.unit_name)}/{self.dirname}"

    def as_dict(self) -> dict:
        return {"id": self.id, "unit": self.unit_name, **self.record.as_dict()}


def next_dirname(existing: tuple[str, ...], now: float, number: int | None = None) -> str:
    """NNNN-<UTC time>: the next number, or `number` (0 is an adopted unit, see adopt.py)."""
    numbers = [int(d.split("-", 1)[0]) for d in existing if d.split("-", 1)[0].isdigit()]
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(now))
    return f"{max(numbers, default=0) + 1 if number is None else number:04d}-{stamp}"


def record(remote, existing: tuple[str, ...], unit_text: str, env_text: str, record: Record,
           number: int | None = None) -> Entry:
    """Write a new entry for record.unit: its unit file, its env file without secrets, meta.json."""
    env_kept, prints = withhold_secrets(env_text)
    entry = Entry(record.unit, next_dirname(existing, time.time(), number), replace(record, secrets=prints))
    remote.write(f"{entry.path}/unit", unit_text)
    remote.write(f"{entry.path}/env", env_kept, mode=0o600)
    remote.write(f"{entry.path}/meta.json", entry.record.to_json())
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


def update_result(remote, entry: Entry, **changes) -> Entry:
    """Rewrite an entry's meta.json with some of its Record's fields changed (result, revert)."""
    done = Entry(entry.unit_name, entry.dirname, replace(entry.record, **changes))
    remote.write(f"{done.path}/meta.json", done.record.to_json())
    return done


def entries(remote, unit_name: str | None = None) -> list[Entry]:
    """All entries on the host (or of one unit), oldest first within each unit; one round trip."""
    root = shlex.quote(history_dir(unit_name) if unit_name else history_dir(""))
    answers = framing.ask(remote, framing.each_file(f"{root}/*/meta.json" if unit_name else f"{root}*/*/meta.json"))
    found = []
    for path, body in answers.items():
        unit, dirname = path.split("/")[-3:-1]
        found.append(Entry(unit, dirname, Record.from_json(body or b"", unit)))
    return sorted(found, key=lambda e: (e.unit_name, e.dirname))


def files(remote, entry: Entry) -> tuple[str, str]:
    unit, env = remote.read_all(f"{entry.path}/unit", f"{entry.path}/env")
    if unit is None or env is None:
        raise FileNotFoundError(f"{remote.label}: {entry.path}: unit or env file missing from the entry")
    return unit.decode(), env.decode()
