"""Ops-side draft/target check from the two config.json files (and the draft's safetensors
header), read locally or over SSH, before anything is started, so a mismatched pair never
reaches a host. The rules are the runtime's own (serving/contract/pairing.py, stdlib only):
tapped layers exist, the draft's fc input width (read from `fc.weight` in the safetensors header
when present) equals len(target_layer_ids) x target hidden_size, the mask token and vocabulary
agree, the block size and budget are usable. Files are read through ddops.checkpoint.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass

from ddops.checkpoint import Files, LocalFiles, PreflightError, RemoteFiles, read_config, tensors
from serving.contract.pairing import Problem, problems, text_config


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
    return Pair(target_path, draft_path, text_config(read_config(files, target_path)),
                read_config(files, draft_path), fc_in_features(files, draft_path))


def check_model_dir(files: Files, path: str, role: str) -> list[Problem]:
    config = posixpath.join(path, "config.json")
    if files.exists(config):
        return []
    return [Problem(f"{role} model path", f"{config} does not exist")]


def fc_in_features(files: Files, draft_path: str) -> int | None:
    """Input width of `fc.weight` from the safetensors header ([out, in]); None if absent."""
    for tensor, info in tensors(files, draft_path):
        if tensor.split(".")[-2:] == ["fc", "weight"] and len(info.get("shape", [])) == 2:
            return int(info["shape"][1])
    return None


__all__ = ["Files", "LocalFiles", "Pair", "PreflightError", "Problem", "RemoteFiles", "check_model_dir",
           "check_pair", "fc_in_features", "read_pair"]
