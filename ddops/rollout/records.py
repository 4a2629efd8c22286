"""Files this machine keeps for rollouts: the running shadow's record and saved results.

Everything lives under $DDOPS_STATE (default ~/.local/state/ddops): `shadow.json` (at most one
shadow at a time), `results/*.json` (shadow comparisons), `rollouts/*.json` (fleet state).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path


def state_dir() -> Path:
    return Path(os.environ.get("DDOPS_STATE") or "~/.local/state/ddops").expanduser()


@dataclass(frozen=True)
class ShadowRecord:
    """A candidate running beside production, and where production runs."""

    profile: str  # profile name or path, as `shadow start` was given it
    host: str
    unit: str  # <service>-shadow.service
    port: int
    url: str  # where clients (and compare) reach the shadow
    production_host: str
    production_unit: str
    production_url: str
    production_profile: str | None  # from the production host's deploy history, when known
    started: float
    tap_url: str | None = None  # the mirror relay's GET /mirror on production's host, when one runs
    # the start still under way (lock.Holder.as_dict()): written before the first host change, so
    # a start killed anywhere is recorded; None once the shadow passed its gate
    starting_by: dict | None = None

    def to_dict(self) -> dict:
        return asdict(self)

    @property
    def started_ok(self) -> bool:
        return self.starting_by is None


def shadow_file() -> Path:
    return state_dir() / "shadow.json"


def load_shadow() -> ShadowRecord | None:
    path = shadow_file()
    if not path.exists():
        return None
    return ShadowRecord(**json.loads(path.read_text()))


def save_shadow(record: ShadowRecord) -> Path:
    return _write(shadow_file(), record.to_dict())


def clear_shadow() -> None:
    shadow_file().unlink(missing_ok=True)


def save_result(kind: str, doc: dict, results_dir: Path | None = None) -> Path:
    folder = Path(results_dir) if results_dir else state_dir() / "results"
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    path = folder / f"{kind}-{stamp}.json"
    n = 1
    while path.exists():
        n += 1
        path = folder / f"{kind}-{stamp}-{n}.json"
    return _write(path, doc)


def _write(path: Path, doc: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc, indent=2, default=str))
    os.replace(tmp, path)
    return path
