"""Read a model's memory facts: config.json plus the safetensors headers next to it.

I/O edge of the planner. `files` is the preflight file reader (LocalFiles here, RemoteFiles
over a host's SSH connection), so the same code reads a checkpoint on this machine or on the
host that will serve it. Only headers are read (8 bytes + the JSON header per file), never
the weights.
"""

from __future__ import annotations

import json
import posixpath
import struct

from ddops.fit.model import ModelFacts, facts_from_config
from ddops.preflight import Files, PreflightError

# safetensors dtype -> bytes per element; floats load in the runtime's dtype, the rest as stored
FLOAT_DTYPES = {"F64", "F32", "F16", "BF16"}
ELEMENT_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "F8_E4M3": 1, "F8_E5M2": 1, "I64": 8,
                 "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1}
HEADER_LIMIT = 100_000_000


def read_model(files: Files, path: str) -> ModelFacts:
    """Facts of the checkpoint at `path`; raises PreflightError naming the file on failure."""
    config_path = posixpath.join(path, "config.json")
    if not files.exists(config_path):
        raise PreflightError(f"{config_path}: does not exist")
    try:
        config = json.loads(files.read_text(config_path))
    except json.JSONDecodeError as err:
        raise PreflightError(f"{config_path}: not valid JSON ({err.msg} at line {err.lineno})") from None
    return facts_from_config(config, path, weight_sizes(files, path))


def weight_sizes(files: Files, path: str) -> tuple[int, int] | None:
    """(floating-point parameters, bytes of other tensors) over every safetensors file, or None."""
    names = weight_files(files, path)
    if not names:
        return None
    params = fixed = 0
    for name in names:
        for tensor, info in header(files, posixpath.join(path, name)).items():
            if tensor == "__metadata__":
                continue
            count = _numel(info.get("shape", []))
            if info.get("dtype") in FLOAT_DTYPES:
                params += count
            else:
                fixed += count * ELEMENT_BYTES.get(info.get("dtype"), 1)
    return params, fixed


def weight_files(files: Files, path: str) -> list[str]:
    index = posixpath.join(path, "model.safetensors.index.json")
    if files.exists(index):
        weight_map = json.loads(files.read_text(index)).get("weight_map", {})
        return sorted(set(weight_map.values()))
    return ["model.safetensors"] if files.exists(posixpath.join(path, "model.safetensors")) else []


def header(files: Files, path: str) -> dict:
    # layout: u64 little-endian header length N, then N bytes of JSON
    head = files.read_head(path, 0, 8)
    if len(head) != 8:
        raise PreflightError(f"{path}: not a safetensors file (shorter than 8 bytes)")
    (length,) = struct.unpack("<Q", head)
    if length > HEADER_LIMIT:
        raise PreflightError(f"{path}: not a safetensors file (header length {length})")
    try:
        return json.loads(files.read_head(path, 8, length))
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise PreflightError(f"{path}: safetensors header is not valid JSON") from None


def _numel(shape: list[int]) -> int:
    count = 1
    for dim in shape:
        count *= int(dim)
    return count
