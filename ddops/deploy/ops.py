"""Day-2 operations on one host: which ddops units it has, their status, rollback targets.
Used by `ddops status|logs|history|rollback|diagnose`."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

import httpx

from ddops import exits, systemd
from ddops.deploy import history
from ddops.deploy.desired import api_key_of, env_file_of, unit_argv
from ddops.deploy.facts import STATE, UnitState, deploy_dir, unit_state
from ddops import server_info, spec_metrics
from ddops.profile.launch import Launch, read_launch
from ddops.profile.methods import METHODS
from ddops.deploy.gate import GateSpec, endpoint
from ddops.server_info import accept_length
from ddops.deploy.lock import current_holder
from ddops.deploy.plan import Desired
from ddops.deploy.recover import RESTORED_AT, unit_paths
from ddops.deploy.tunnel import reachable
from ddops.render import read_header


class OpsError(exits.BadInput):
    """Bad input for an operation (unknown unit, no such history entry): exit 2."""


def units_on(remote) -> list[str]:
    """Every unit ddops has deployed on the host, or begun to: a first deploy killed before its
    history entry has only its deploy/ folder (its pending.json and backup), and still runs."""
    out = remote.run(f"ls {STATE}/history {STATE}/deploy 2>/dev/null || true").stdout
    return sorted({name for name in out.split() if name.endswith(".service")})


def pick_unit(remote, unit: str | None) -> str:
    if unit:
        return unit if unit.endswith(".service") else f"{unit}.service"
    units = units_on(remote)
    if len(units) == 1:
        return units[0]
    if not units:
        raise OpsError(f"{remote.host.name}: ddops has deployed nothing here yet")
    raise OpsError(f"{remote.host.name}: several units ({', '.join(units)}); pass --unit")


@dataclass(frozen=True)
class UnitStatus:
    host: str
    unit: str
    active: str
    sub: str
    restarts: int
    profile: str | None
    hash: str | None
    version: str | None          # ddops version that rendered the unit
    runtime_version: str | None  # what the running server reports
    url: str | None
    health: str                  # "200", "503", "unreachable", "-"
    accept_length: float | None
    model: str | None
    algorithm: str | None
    lock: dict | None            # the deploy lock's holder while a deploy runs

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Reading:
    """What unit_status read, for callers that keep more than the status (a switch's snapshot)."""
    status: UnitStatus
    unit_text: str | None
    env_text: str | None        # the env file the unit names, None when it names none or it is missing
    server_info: dict           # {} unless /health answered 200


def unit_status(remote, unit: str) -> UnitStatus:
    return read_unit(remote, unit).status


def read_unit(remote, unit: str) -> Reading:
    """The unit's files, systemd state, /health and /server_info (with the unit's own key), and
    the deploy lock's holder; each read once."""
    unit_text = remote.read_text(f"/etc/systemd/system/{unit}")
    head = read_header(unit_text or "")
    argv = unit_argv(unit_text)
    state: UnitState = unit_state(remote, unit)
    url = endpoint(argv, remote.host.address) if argv else None
    env_path = env_file_of(unit_text)
    env_text = remote.read_text(env_path) if env_path else None
    health, info = ("-", {})
    launch = read_launch(argv)
    if url:
        with reachable(remote, url) as where:
            health, info = _probe(where, api_key_of(env_text), launch)
    status = UnitStatus(remote.host.name, unit, state.active, state.sub, state.restarts,
                        head.get("profile"), head.get("hash"), head.get("version"), info.get("version"),
                        url, health, accept_length(info), info.get("model_path"),
                        info.get("speculative_algorithm"), current_holder(remote))
    return Reading(status, unit_text, env_text, info)


def _probe(url: str, key: str | None, launch: Launch) -> tuple[str, dict]:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    try:
        with httpx.Client(base_url=url, headers=headers, trust_env=False, timeout=5) as client:
            health = client.get("/health").status_code
            if health != 200:
                return str(health), {}
            table = launch.table
            if table is not None and table.identity == "models":
                return str(health), _models_info(client, launch)
            return str(health), server_info.read_or_empty(client)
    except (httpx.HTTPError, ValueError):
        return "unreachable", {}


def _models_info(client: httpx.Client, launch: Launch) -> dict:
    """A runtime without /server_info (vLLM), in the fields status reads: its /version, the
    model root /v1/models names, the method its command line runs and the accepted length its
    /metrics counters give."""
    version = client.get("/version").json() if client.get("/version").status_code == 200 else {}
    models = client.get("/v1/models")
    entries = models.json().get("data", []) if models.status_code == 200 else []
    root = next((e.get("root") for e in entries if isinstance(e, dict)), None)
    counted = spec_metrics.read(client)
    length = counted.accept_length if isinstance(counted, spec_metrics.SpecCounters) else None
    method = METHODS[launch.method].sglang_name if launch.method else None
    return {"version": version.get("version") if isinstance(version, dict) else None, "model_path": root,
            "speculative_algorithm": method, "internal_states": [{"avg_spec_accept_length": length}]}


def rollback_entry(remote, unit: str, to: str | None) -> history.Entry:
    """`--to ID`, or the entry before what the unit runs now (previous_good). What it runs now is
    what a killed deploy's recovery will put back (settled_unit), so a rollback killed and run
    again goes where the first one went."""
    entries = history.entries(remote, unit)
    if to is not None:
        for entry in entries:
            if entry.id == to.zfill(4):
                return entry
        known = ", ".join(e.id for e in entries) or "none"
        raise OpsError(f"{remote.host.name}: no history entry {to} for {unit} (known: {known})")
    entry = previous_good(entries, read_header(settled_unit(remote, unit) or "").get("hash"))
    if entry is None:
        raise OpsError(f"{remote.host.name}: no earlier passed deploy of {unit} to roll back to")
    return entry


def settled_unit(remote, unit: str) -> str | None:
    """The unit file the host will hold once an unfinished deploy of it is recovered: the backup
    while a pending.json says one was cut short (recovery restores it), else the file there now."""
    folder = deploy_dir(unit)
    pending, backup, text = remote.read_all(f"{folder}/pending.json", f"{folder}/backup/unit", unit_paths(unit)[0])
    try:
        stage = json.loads(pending).get("stage") if pending is not None else None
    except (ValueError, AttributeError):
        stage = None
    found = backup if stage in RESTORED_AT else text   # no backup there: recovery removes the new unit
    return None if found is None else found.decode()


GOOD = ("passed", "adopted")   # results a rollback may return to (adopted: hand-written, entry 0)


def previous_good(entries: list[history.Entry], current_hash: str | None) -> history.Entry | None:
    """Pure: the newest entry that passed its gate (or was adopted) and is not what runs now.
    When what runs now came back by a rollback, that rollback's own `returns_to` chain is followed
    to the entry that first brought it, and only entries older than that count: a second
    rollback goes further back instead of undoing the first."""
    position = len(entries)
    current = next((i for i in reversed(range(len(entries))) if entries[i].record.hash == current_hash
                    and entries[i].record.result in GOOD), None)
    index = {e.id: i for i, e in enumerate(entries)}
    while current is not None and index.get(entries[current].record.returns_to or "", len(entries)) < current:
        current = position = index[entries[current].record.returns_to]
    for entry in reversed(entries[:position]):
        if entry.record.result in GOOD and entry.record.hash != current_hash:
            return entry
    return None


def desired_of(remote, entry: history.Entry) -> tuple[Desired, GateSpec]:
    unit_text, env_kept = history.files(remote, entry)
    record = entry.record
    if record.gate_spec is None:
        raise OpsError(f"{remote.host.name}: history entry {entry.id} of {entry.unit_name} ({record.result}) "
                       "holds no gate spec to gate a return to it with")
    try:    # history keeps fingerprints, not keys: the key comes from the host's env file now
        env_text = history.restore_secrets(env_kept, remote.read_text(record.env_path))
    except history.SecretMissing as err:
        raise OpsError(f"{remote.host.name}: history entry {entry.id} of {entry.unit_name}: {err}") from None
    desired = Desired(entry.unit_name, record.unit_path, unit_text, record.env_path, env_text,
                      record.profile, record.hash)
    return desired, record.gate_spec


def logs_command(unit: str, lines: int, follow: bool) -> str:
    return systemd.journal(unit, lines, output="short-iso", follow=follow)
