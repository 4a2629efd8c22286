"""Backup and revert: put the previous unit and env file back byte for byte.

The backup of a deploy lives in deploy/<unit>/backup/ on the host (unit, env, meta.json
saying which of them existed and whether the service was running). Revert restores exactly
that: files back (or removed when there were none), daemon-reload, and the service back in
its previous state, confirmed healthy when it was running before.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, replace

from ddops.deploy.facts import Facts, deploy_dir, unit_state
from ddops import systemd
from ddops.deploy.gate import GateSpec, run_health
from ddops.deploy.unitwatch import UnitWatch
from ddops.deploy.tunnel import reachable

q = shlex.quote


@dataclass(frozen=True)
class RevertResult:
    ok: bool
    state: str          # what the host is in now, in words (exit 3 prints it)


def backup_dir(unit_name: str) -> str:
    return f"{deploy_dir(unit_name)}/backup"


def take_backup(remote, facts: Facts) -> dict:
    """Save what the host holds now; returns the backup's meta."""
    folder = backup_dir(facts.unit_name)
    remote.run(f"rm -rf {q(folder)} && mkdir -p {q(folder)}")
    if facts.unit_text is not None:
        remote.write(f"{folder}/unit", facts.unit_text)
    if facts.env_text is not None:
        remote.write(f"{folder}/env", facts.env_text, mode=0o600)
    meta = {"had_unit": facts.unit_text is not None, "had_env": facts.env_text is not None,
            "was_active": facts.state.active in ("active", "activating", "reloading"),
            "was_enabled": facts.state.enabled == "enabled"}
    remote.write(f"{folder}/meta.json", json.dumps(meta))
    return meta


def revert(remote, unit_name: str, unit_path: str, env_path: str, health: GateSpec | None,
           progress=lambda name, text: None) -> RevertResult:
    """Restore the backup; `health` (the previous service's endpoint) confirms it answers."""
    folder = backup_dir(unit_name)
    meta_bytes, unit, env = remote.read_all(f"{folder}/meta.json", f"{folder}/unit", f"{folder}/env")
    if meta_bytes is None:
        return RevertResult(False, f"no backup in {folder}; {unit_name} left as the failed deploy made it")
    meta = json.loads(meta_bytes)
    try:
        if not meta["had_unit"]:
            return _remove_new(remote, unit_name, unit_path, env_path)
        _restore_files(remote, folder, meta, unit, env, unit_path, env_path)
    except Exception as err:  # noqa: BLE001 - any failure here is reported as host state
        return RevertResult(False, f"restoring {unit_path} failed ({err}); the host holds the new, "
                                   f"failed unit or a mix; backup kept in {folder}")
    if not meta["was_active"]:
        remote.run(systemd.stop(unit_name), check=False)
        return RevertResult(True, f"previous {unit_name} restored (it was not running, left stopped)")
    remote.run(systemd.restart(unit_name),
               check=False, timeout=health.timeout_s if health else 600)
    if health is None:
        return RevertResult(True, f"previous {unit_name} restored and restarted (no endpoint to check)")
    with reachable(remote, health.base_url) as url, UnitWatch(remote, unit_name) as watch:
        report = run_health(replace(health, base_url=url), watch, progress=progress)
    if report.passed:
        return RevertResult(True, f"previous {unit_name} restored byte for byte, restarted and healthy "
                                  f"({health.base_url})")
    return RevertResult(False, f"previous {unit_name} restored byte for byte but NOT healthy after restart: "
                               f"{report.failure.detail}; the service is down")


def _restore_files(remote, folder: str, meta: dict, unit: bytes | None, env: bytes | None,
                   unit_path: str, env_path: str) -> None:
    if unit is None or (meta["had_env"] and env is None):
        raise FileNotFoundError(f"{folder} lacks the unit or env file its meta.json names")
    remote.write(unit_path, unit)
    if meta["had_env"]:
        remote.write(env_path, env, mode=0o600)
    else:
        remote.run(f"rm -f {q(env_path)}")
    if remote.read(unit_path) != unit:
        raise RuntimeError(f"{unit_path} differs from the backup after writing it")
    remote.run(systemd.daemon_reload())


def _remove_new(remote, unit_name: str, unit_path: str, env_path: str) -> RevertResult:
    remote.run(systemd.remove(unit_name, unit_path, env_path), check=False)
    state = unit_state(remote, unit_name)
    if state.active in ("active", "activating"):
        return RevertResult(False, f"{unit_name} is still {state.active} after stop; stop it by hand")
    return RevertResult(True, f"there was no previous unit: {unit_name} stopped, disabled and removed")
