"""Ops-side draft/target check from the two config.json files (and the draft's safetensors
header), read locally or over SSH. No torch: the serving side has its own check at start-up;
this one runs before anything is started so a mismatched pair never reaches a host.

Rules (research/engine.md "Config guards"):
- every draft `target_layer_ids` entry names a target decoder layer that exists;
- the draft's fc input width == len(target_layer_ids) x target hidden_size
  (fc: [K * H_target] -> H_draft; width read from `fc.weight` in the safetensors header
  when present, else assumed K x draft hidden_size, which is how drafts are built);
- the draft's mask token id is inside the target vocabulary.
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


@dataclass(frozen=True)
class Problem:
    key: str                # the config key at fault, e.g. "draft fc.weight"
    reason: str

    def __str__(self) -> str:
        return f"{self.key}: {self.reason}"


def target_layer_ids(draft: dict, target_layers: int) -> list[int]:
    """The draft's tapped target layers; derived evenly when the config omits them."""
    dflash = draft.get("dflash_config") or {}
    ids = dflash.get("target_layer_ids", draft.get("target_layer_ids"))
    if ids is not None:
        return [int(i) for i in ids]
    n = int(draft.get("num_hidden_layers", 1))
    layers = int(draft.get("num_target_layers", target_layers))
    if n == 1:
        return [layers // 2]
    return [round(1 + i * (layers - 4) / (n - 1)) for i in range(n)]


def mask_token_id(draft: dict) -> int | None:
    dflash = draft.get("dflash_config") or {}
    value = dflash.get("mask_token_id", draft.get("mask_token_id"))
    return None if value is None else int(value)


def check_pair(pair: Pair) -> list[Problem]:
    """Pure: every way the draft does not fit the target (empty list = fits)."""
    target, draft = pair.target, pair.draft
    layers = int(target["num_hidden_layers"])
    hidden = int(target["hidden_size"])
    vocab = int(target["vocab_size"])
    ids = target_layer_ids(draft, layers)
    problems = []
    bad = [i for i in ids if not 0 <= i < layers]
    if bad:
        problems.append(Problem("draft dflash_config.target_layer_ids",
                                f"layers {bad} do not exist in the target "
                                f"({pair.target_path} has num_hidden_layers={layers})"))
    width = pair.fc_in_features
    source = "fc.weight"
    if width is None:
        width, source = len(ids) * int(draft["hidden_size"]), "hidden_size"
    want = len(ids) * hidden
    if width != want:
        problems.append(Problem(f"draft {source}",
                                f"draft fc input width {width} ({pair.draft_path}) does not match "
                                f"target: {len(ids)} target layers x hidden_size {hidden} = {want} "
                                f"({pair.target_path})"))
    mask = mask_token_id(draft)
    if mask is not None and not 0 <= mask < vocab:
        problems.append(Problem("draft dflash_config.mask_token_id",
                                f"{mask} is outside the target vocabulary (vocab_size={vocab})"))
    return problems


def read_pair(files: Files, target_path: str, draft_path: str) -> Pair:
    return Pair(target_path, draft_path, _text_config(_read_config(files, target_path)),
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


def _text_config(config: dict) -> dict:
    # multimodal checkpoints (e.g. Qwen3.5) nest the language model's fields
    return config["text_config"] if "hidden_size" not in config and "text_config" in config else config


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
