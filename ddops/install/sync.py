"""Copy a directory's files to a host, skipping those whose sha256 already matches there.

The plan is pure (checksums in, copy/skip lists out); the edges read checksums here and on the
host and upload each changed file atomically through Remote.put (temp name + rename).
"""

import hashlib
import os
import posixpath
import shlex
from dataclasses import dataclass
from pathlib import Path

from ddops.lab.errors import LabError
from ddops.remote import Remote

TMP_GLOB = ".*.ddops-tmp-*"   # Remote's temporary names; a killed push may leave them behind


@dataclass(frozen=True)
class SyncPlan:
    copy: tuple[str, ...]     # relative paths whose bytes differ on the host (or are missing there)
    skip: tuple[str, ...]     # relative paths already identical on the host


@dataclass(frozen=True)
class SyncReport:
    dest: str
    copied: tuple[str, ...]
    skipped: tuple[str, ...]
    bytes_copied: int


def plan_sync(local: dict[str, str], remote: dict[str, str]) -> SyncPlan:
    """local/remote: relative path -> sha256 hex. Files only on the host are left alone."""
    copy = tuple(sorted(p for p, sha in local.items() if remote.get(p) != sha))
    skip = tuple(sorted(p for p, sha in local.items() if remote.get(p) == sha))
    return SyncPlan(copy, skip)


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def local_files(directory: Path) -> dict[str, Path]:
    """Relative POSIX path -> file for every regular file under directory (symlinks followed)."""
    if not directory.is_dir():
        raise LabError(f"{directory}: not a directory")
    files = {}
    for parent, _, names in os.walk(directory, followlinks=True):
        for name in names:
            path = Path(parent) / name
            if path.is_file():
                files[path.relative_to(directory).as_posix()] = path
    if not files:
        raise LabError(f"{directory}: no files to push")
    return files


def remote_checksums(remote: Remote, dest: str) -> dict[str, str]:
    """sha256 of every file under dest on the host ({} when dest does not exist)."""
    quoted = shlex.quote(dest)
    out = remote.run(f"test -d {quoted} || exit 0; cd {quoted} && "
                     f"find . -type f ! -name '{TMP_GLOB}' -print0 | xargs -0 -r sha256sum").stdout
    sums = {}
    for line in out.splitlines():
        sha, _, rel = line.partition("  ")
        if rel:
            sums[rel.removeprefix("./")] = sha
    return sums


def sync_files(remote: Remote, files: dict[str, Path], dest: str, log=print) -> SyncReport:
    """Make dest/<rel> on the host byte-identical to each local file."""
    remote.mkdir(dest)
    remote.run(f"find {shlex.quote(dest)} -name '{TMP_GLOB}' -type f -delete")
    plan = plan_sync({rel: sha256_file(path) for rel, path in files.items()}, remote_checksums(remote, dest))
    copied = 0
    for rel in plan.copy:
        log(f"  copy {rel}")
        remote.put(files[rel], posixpath.join(dest, rel), mode=0o644)
        copied += files[rel].stat().st_size
    return SyncReport(dest, plan.copy, plan.skip, copied)


def push_model(remote: Remote, directory: Path, dest: str | None = None, log=print) -> SyncReport:
    """Copy a model directory to dest (default /var/lib/ddops/models/<directory name>)."""
    target = dest or f"/var/lib/ddops/models/{directory.resolve().name}"
    if not posixpath.isabs(target):
        raise LabError(f"--dest {target}: must be an absolute path on the host")
    return sync_files(remote, local_files(directory), target, log)
