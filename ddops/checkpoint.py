"""The one checkpoint reader: a model directory's config.json and its safetensors headers
(8 bytes + the JSON header per file, never the weights), read on this machine (LocalFiles) or on
a host over its SSH connection (RemoteFiles). The draft/target preflight and the memory-fit
planner both read checkpoints through here.
"""

from __future__ import annotations

import base64
import json
import posixpath
import shlex
import struct
from pathlib import Path
from typing import Iterator, Protocol

from ddops import exits

HEADER_LIMIT = 100_000_000


class PreflightError(exits.BadInput):
    """A file could not be read or parsed; one line naming the file and reason."""


class Files(Protocol):
    def read_text(self, path: str) -> str: ...
    def read_head(self, path: str, start: int, length: int) -> bytes: ...
    def exists(self, path: str) -> bool: ...


def read_config(files: Files, path: str) -> dict:
    """config.json of the checkpoint directory `path`."""
    config = posixpath.join(path, "config.json")
    if not files.exists(config):
        raise PreflightError(f"{config}: does not exist")
    try:
        return json.loads(files.read_text(config))
    except json.JSONDecodeError as err:
        raise PreflightError(f"{config}: not valid JSON ({err.msg} at line {err.lineno})") from None


def weight_files(files: Files, path: str) -> list[str]:
    """The safetensors files of a checkpoint (sharded through the index, or the single file)."""
    index = posixpath.join(path, "model.safetensors.index.json")
    if files.exists(index):
        weight_map = json.loads(files.read_text(index)).get("weight_map", {})
        return sorted(set(weight_map.values()))
    return ["model.safetensors"] if files.exists(posixpath.join(path, "model.safetensors")) else []


def header(files: Files, path: str) -> dict:
    """The JSON header of one safetensors file: u64 little-endian length N, then N bytes of JSON."""
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


def tensors(files: Files, path: str, names: list[str] | None = None) -> Iterator[tuple[str, dict]]:
    """(tensor name, {dtype, shape, data_offsets}) over every weight file of the checkpoint
    (`names`: its weight files, when the caller has listed them already)."""
    for name in weight_files(files, path) if names is None else names:
        for tensor, info in header(files, posixpath.join(path, name)).items():
            if tensor != "__metadata__":
                yield tensor, info


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
    """The same reads on a host, over a `ddops.remote.Remote`, each answered once per connection
    (`of`): the planning checks, the fit prediction and a re-plan under the deploy lock ask for
    the same config.json files and safetensors headers, and every question is a round trip."""

    HEAD_BLOCK = 1 << 16      # the first bytes of a file, fetched whole: a safetensors length + header

    def __init__(self, remote):
        self.remote = remote
        self.known: dict[tuple, object] = {}

    @classmethod
    def of(cls, remote) -> "RemoteFiles":
        """The connection's reader (kept in remote.cache)."""
        if "checkpoint files" not in remote.cache:
            remote.cache["checkpoint files"] = cls(remote)
        return remote.cache["checkpoint files"]

    def read_text(self, path: str) -> str:
        return self._once(("text", path), lambda: self._run(f"cat {shlex.quote(path)}", path))

    def read_head(self, path: str, start: int, length: int) -> bytes:
        block = self._once(("head", path), lambda: self._head(path, 0, self.HEAD_BLOCK))
        if start + length <= len(block) or len(block) < self.HEAD_BLOCK:   # inside it, or the file ends there
            return block[start:start + length]
        return self._once(("head", path, start, length), lambda: self._head(path, start, length))

    def exists(self, path: str) -> bool:
        return self._once(("exists", path),
                          lambda: self.remote.run(f"test -f {shlex.quote(path)}", check=False).ok)

    def _once(self, key: tuple, read):
        if key not in self.known:
            self.known[key] = read()
        return self.known[key]

    def _head(self, path: str, start: int, length: int) -> bytes:
        cmd = f"tail -c +{start + 1} {shlex.quote(path)} | head -c {length} | base64 -w0"
        return base64.b64decode(self._run(cmd, path))

    def _run(self, cmd: str, path: str) -> str:
        result = self.remote.run(cmd, check=False)
        if not result.ok:
            raise PreflightError(f"{path}: cannot read on the host ({result.stderr.strip()[:200]})")
        return result.stdout
