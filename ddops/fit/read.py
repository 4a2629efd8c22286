"""Read a model's memory facts: config.json plus the safetensors headers next to it.

I/O edge of the planner, through ddops.checkpoint (the reader preflight uses too): LocalFiles
here, RemoteFiles over a host's SSH connection, so the same code reads a checkpoint on this
machine or on the host that will serve it. Only headers are read, never the weights.
"""

from __future__ import annotations

from ddops.checkpoint import Files, read_config, tensors, weight_files
from ddops.fit.model import ModelFacts, facts_from_config

# safetensors dtype -> bytes per element; floats load in the runtime's dtype, the rest as stored
FLOAT_DTYPES = {"F64", "F32", "F16", "BF16"}
ELEMENT_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "F8_E4M3": 1, "F8_E5M2": 1, "I64": 8,
                 "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1}


def read_model(files: Files, path: str) -> ModelFacts:
    """Facts of the checkpoint at `path`; raises PreflightError naming the file on failure."""
    return facts_from_config(read_config(files, path), path, weight_sizes(files, path))


def weight_sizes(files: Files, path: str) -> tuple[int, int] | None:
    """(floating-point parameters, bytes of other tensors) over every safetensors file, or None."""
    names = weight_files(files, path)
    if not names:
        return None
    params = fixed = 0
    for _, info in tensors(files, path, names):
        count = _numel(info.get("shape", []))
        if info.get("dtype") in FLOAT_DTYPES:
            params += count
        else:
            fixed += count * ELEMENT_BYTES.get(info.get("dtype"), 1)
    return params, fixed


def _numel(shape: list[int]) -> int:
    count = 1
    for dim in shape:
        count *= int(dim)
    return count
