"""Ops-side draft/target check from the two config.json files (and the draft's safetensors
header), read locally or over SSH, before anything is started, so a mismatched pair never
reaches a host. The rules are the runtime's own (serving/contract/pairing.py, stdlib only):
tapped layers exist, the draft's fc input width (read from `fc.weight` in the safetensors header
when present) equals len(target_layer_ids) x target hidden_size, the mask token and vocabulary
agree, the block size and budget are usable. This module only reads the files.
"""

from __future__ import annotations

import base64
import json
import posixpath
import shlex
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from serving.contract.pairing import Problem, problems, text_config


class PreflightError(Exception):
    """A file could not be read or parsed; one line naming the file and reason."""


class Files(Protocol):
    def read_text(self, path: str) -> str: ...
    def read_head(self, path: str, start: int, length: int) -> bytes: ...
    def exists(self, path: str) -> bool: ...


@dataclass(frozen=True)
class Pair:
    target_path: str
    draft_path: str
    target: dict            # target config.json (text config if nested)
    draft: dict             # draft config.json
    fc_in_features: int | None


def check_pair(pair: Pair, block_size: int | None = None, budget: int | None = None) -> list[Problem]:
    """Pure: every way the draft does not fit the target (empty list = fits); reasons name the paths."""
    found = problems(pair.draft, pair.target, block_size, budget, pair.fc_in_features)
    where = f" (draft {pair.draft_path}, target {pair.target_path})"
    return [Problem(p.key, p.reason + where) for p in found]


def read_pair(files: Files, target_path: str, draft_path: str) -> Pair:
    return Pair(target_path, draft_path, text_config(_read_config(files, target_path)),
                _read_config(files, draft_path), fc_in_features(files, draft_path))


def check_model_dir(files: Files, path: str, role: str) -> list[Problem]:
    config = posixpath.join(path, "config.json")
    if files.exists(config):
        return []
    return [Problem(f"{role} model path", f"{config} does not exist")]


def fc_in_features(files: Files, draft_path: str) -> int | None:
    """Input width of `fc.weight` from the safetensors header ([out, in]); None if absent."""
    for name in _weight_files(files, draft_path):
        header = _safetensors_header(files, posixpath.join(draft_path, name))
        for tensor, info in header.items():
            if tensor.split(".")[-2:] == ["fc", "weight"] and len(info.get("shape", [])) == 2:
                return int(info["shape"][1])
    return None


def _weight_files(files: Files, path: str) -> list[str]:
    index = posixpath.join(path, "model.safetensors.index.json")
    if files.exists(index):
        weight_map = json.loads(files.read_text(index)).get("weight_map", {})
        return sorted(set(weight_map.values()))
    single = posixpath.join(path, "model.safetensors")
    return ["model.safetensors"] if files.exists(single) else []


def _safetensors_header(files: Files, path: str) -> dict:
    # layout: u64 little-endian header length N, then N bytes of JSON
    (length,) = struct.unpack("<Q", files.read_head(path, 0, 8))
    if length > 100_000_000:
        raise PreflightError(f"{path}: not a safetensors file (header length {length})")
    return json.loads(files.read_head(path, 8, length))


def _read_config(files: Files, path: str) -> dict:
    config = posixpath.join(path, "config.json")
    if not files.exists(config):
        raise PreflightError(f"{config}: does not exist")
    try:
        return json.loads(files.read_text(config))
    except json.JSONDecodeError as err:
        raise PreflightError(f"{config}: not valid JSON ({err.msg} at line {err.lineno})") from None


class LocalFiles:
    def read_text(self, path: str) -> str:
        return Path(path).read_text()

    def read_head(self, path: str, start: int, length: int) -> bytes:
        with open(path, "rb") as f:
            f.seek(start)
            return f.read(length)

    def exists(self, path: str) -> bool:
        return Path(path).is_file()


class RemoteFiles:
    """The same reads on a host, over a `ddops.remote.Remote`."""

    def __init__(self, remote):
        self.remote = remote

    def read_text(self, path: str) -> str:
        return self._run(f"cat {shlex.quote(path)}", path)

    def read_head(self, path: str, start: int, length: int) -> bytes:
        cmd = f"tail -c +{start + 1} {shlex.quote(path)} | head -c {length} | base64 -w0"
        return base64.b64decode(self._run(cmd, path))

    def exists(self, path: str) -> bool:
        return self.remote.run(f"test -f {shlex.quote(path)}", check=False).ok

    def _run(self, cmd: str, path: str) -> str:
        result = self.remote.run(cmd, check=False)
        if not result.ok:
            raise PreflightError(f"{path}: cannot read on the host ({result.stderr.strip()[:200]})")
        return result.stdout
