"""Copy a directory's files to a host, skipping those whose sha256 already matches there.

The plan is pure (checksums in, copy/skip lists out); the edges read checksums here and on the
host and upload each changed file to a partial file named by its sha256 (a killed push resumes
where it stopped), check the sha256 on the host, and rename it into place.
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
PART_GLOB = ".*.ddops-part-*"  # uploads in progress, kept so the next push resumes them


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
    out = remote.run(f"test -d {quoted} || exit 0; cd {quoted} && find . -type f ! -name '{TMP_GLOB}' "
                     f"! -name '{PART_GLOB}' -print0 | xargs -0 -r sha256sum").stdout
    sums = {}
    for line in out.splitlines():
        sha, _, rel = line.partition("  ")
        if rel:
            sums[rel.removeprefix("./")] = sha
    return sums


def local_checksums(files: dict[str, Path]) -> dict[str, str]:
    return {rel: sha256_file(path) for rel, path in files.items()}


def sync_files(remote: Remote, files: dict[str, Path], dest: str, log=print, progress=None,
               local_sums: dict[str, str] | None = None) -> SyncReport:
    """Make dest/<rel> on the host byte-identical to each local file (resumable, sha256-verified).
    progress(total=...) once with the bytes to send, then progress(advance=n) as they go."""
    remote.mkdir(dest)
    remote.run(f"find {shlex.quote(dest)} -name '{TMP_GLOB}' -type f -delete")
    sums = local_sums or local_checksums(files)
    plan = plan_sync(sums, remote_checksums(remote, dest))
    total = sum(files[rel].stat().st_size for rel in plan.copy)
    tick = progress or (lambda **_: None)
    tick(total=total)
    for rel in plan.copy:
        log(f"  copy {rel}")
        target = posixpath.join(dest, rel)
        if posixpath.dirname(rel):  # a file in a subfolder (tokenizer/, ...): its folder first
            remote.mkdir(posixpath.dirname(target))
        send_file(remote, files[rel], target, sums[rel], lambda n: tick(advance=n))
    return SyncReport(dest, plan.copy, plan.skip, total)


def partial_path(remote: Remote, dest: str, sha: str) -> str:
    """Where an upload accumulates: named by content, so a resumed upload appends to the same bytes.
    Through sudo the SSH user cannot write the target directory: its own /tmp file instead."""
    if remote.become.active:
        return f"/tmp/.ddops-part-{sha}"
    parent, name = posixpath.split(dest)
    return posixpath.join(parent, f".{name}.ddops-part-{sha[:16]}")


def send_file(remote: Remote, local: Path, dest: str, sha: str, advance) -> None:
    """Upload local to dest: resume a partial upload of the same content, verify its sha256 on the
    host, then move it into place atomically (mode 0644)."""
    part, size = partial_path(remote, dest, sha), local.stat().st_size
    sftp = remote.sftp()
    try:
        done = sftp.stat(part).st_size
    except FileNotFoundError:
        done = 0
    if done > size:
        sftp.remove(part)
        done = 0
    advance(done)
    with open(local, "rb") as src, sftp.open(part, "ab" if done else "wb") as dst:
        dst.set_pipelined(True)
        src.seek(done)
        while chunk := src.read(1 << 20):
            dst.write(chunk)
            advance(len(chunk))
    got = remote.run(f"sha256sum {shlex.quote(part)}").stdout.split()[0]
    if got != sha:
        remote.run(f"rm -f {shlex.quote(part)}")
        raise LabError(f"{remote.host.name}:{dest}: sha256 after upload is {got}, expected {sha}; "
                       "the partial upload was removed, run the push again")
    tmp = posixpath.join(posixpath.dirname(dest), f".{posixpath.basename(dest)}.ddops-tmp-{sha[:8]}")
    q = shlex.quote
    place = (f"install -m 644 {q(part)} {q(tmp)} && rm -f {q(part)}" if remote.become.active
             else f"chmod 644 {q(part)} && mv -f {q(part)} {q(tmp)}")
    remote.run(f"{place} && mv -f {q(tmp)} {q(dest)}")


def push_model(remote: Remote, directory: Path, dest: str | None = None, log=print, progress=None,
               local_sums: dict[str, str] | None = None) -> SyncReport:
    """Copy a model directory to dest (default /var/lib/ddops/models/<directory name>)."""
    return sync_files(remote, local_files(directory), model_dest(directory, dest), log, progress, local_sums)


def model_dest(directory: Path, dest: str | None) -> str:
    target = dest or f"/var/lib/ddops/models/{directory.resolve().name}"
    if not posixpath.isabs(target):
        raise LabError(f"--dest {target}: must be an absolute path on the host")
    return target
