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

from ddops import exits
from ddops.remote import Remote
from ddops.remote.connect import FAST_CIPHERS

TMP_GLOB = ".*.ddops-tmp-*"   # Remote's temporary names; a killed push may leave them behind
PART_GLOB = ".*.ddops-part-*"  # uploads in progress, kept so the next push resumes them


# The host's fastest sha256: OpenSSL's uses the CPU's SHA extensions (540 MB in 0.3 s CPU on a lab
# host), coreutils' sha256sum does not (1.4 s). Both print "<hex> <mark><path>".
FAST_SHA256 = "h=sha256sum; command -v openssl >/dev/null 2>&1 && h='openssl dgst -sha256 -r'; "


@dataclass(frozen=True)
class Transfer:
    """How files travel; the defaults are the fastest measured, `bench_push --levers` shows each."""
    one_packet_writes: bool = True   # SFTP writes sized to one SSH packet (32 KiB ones take two)
    fast_sha256: bool = True         # FAST_SHA256 on the host instead of plain sha256sum
    ciphers: tuple[str, ...] = FAST_CIPHERS

    @property
    def hasher(self) -> str:
        """Shell prefix that sets $h to the host's sha256 command."""
        return FAST_SHA256 if self.fast_sha256 else "h=sha256sum; "


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
        raise exits.BadInput(f"{directory}: not a directory")
    files = {}
    for parent, _, names in os.walk(directory, followlinks=True):
        for name in names:
            path = Path(parent) / name
            if path.is_file():
                files[path.relative_to(directory).as_posix()] = path
    if not files:
        raise exits.BadInput(f"{directory}: no files to push")
    return files


def sha256_lines(out: str) -> dict[str, str]:
    """path -> hex from sha256sum ("<hex>  <path>") or `openssl dgst -r` ("<hex> *<path>") lines."""
    sums = {}
    for line in out.splitlines():
        sha, _, marked = line.partition(" ")
        if len(marked) > 1:
            sums[marked[1:]] = sha
    return sums


def remote_checksums(remote: Remote, dest: str, transfer: Transfer = Transfer()) -> dict[str, str]:
    """Make dest (mode 755), delete Remote's temporary files a killed push left there, and return
    the sha256 of every file under it: one command."""
    quoted = shlex.quote(dest)
    out = remote.run(f"mkdir -p -m 755 {quoted} && find {quoted} -name '{TMP_GLOB}' -type f -delete && "
                     f"{transfer.hasher}cd {quoted} && find . -type f ! -name '{TMP_GLOB}' "
                     f"! -name '{PART_GLOB}' -print0 | xargs -0 -r $h").stdout
    return {rel.removeprefix("./"): sha for rel, sha in sha256_lines(out).items()}


def present_checksums(remote: Remote, dest: str, transfer: Transfer = Transfer()) -> dict[str, str]:
    """The sha256 of every file under dest, read only (a dry run): nothing made, nothing deleted."""
    quoted = shlex.quote(dest)
    out = remote.run(f"[ -d {quoted} ] || exit 0; {transfer.hasher}cd {quoted} && find . -type f "
                     f"! -name '{TMP_GLOB}' ! -name '{PART_GLOB}' -print0 | xargs -0 -r $h").stdout
    return {rel.removeprefix("./"): sha for rel, sha in sha256_lines(out).items()}


def preview_sync(remote: Remote, files: dict[str, Path], dest: str, sums: dict[str, str]) -> SyncReport:
    """What sync_files would copy and skip on this host now (`push-model --dry-run`)."""
    plan = plan_sync(sums, present_checksums(remote, dest))
    return SyncReport(dest, plan.copy, plan.skip, sum(files[rel].stat().st_size for rel in plan.copy))


def remote_sha256(remote: Remote, path: str, transfer: Transfer = Transfer()) -> str:
    sums = sha256_lines(remote.run(f"{transfer.hasher}$h {shlex.quote(path)}").stdout)
    return sums.get(path, "")


def local_checksums(files: dict[str, Path]) -> dict[str, str]:
    return {rel: sha256_file(path) for rel, path in files.items()}


def sync_files(remote: Remote, files: dict[str, Path], dest: str, log=print, progress=None,
               local_sums: dict[str, str] | None = None, transfer: Transfer = Transfer()) -> SyncReport:
    """Make dest/<rel> on the host byte-identical to each local file (resumable, sha256-verified).
    progress(total=...) once with the bytes to send, then progress(advance=n) as they go."""
    sums = local_sums or local_checksums(files)
    plan = plan_sync(sums, remote_checksums(remote, dest, transfer))
    total = sum(files[rel].stat().st_size for rel in plan.copy)
    tick = progress or (lambda **_: None)
    tick(total=total)
    folders = sorted({posixpath.join(dest, posixpath.dirname(rel)) for rel in plan.copy if posixpath.dirname(rel)})
    if folders:     # files in subfolders (tokenizer/, ...): every folder in one command
        remote.run("mkdir -p -m 755 " + " ".join(shlex.quote(f) for f in folders))
    for rel in plan.copy:
        log(f"  copy {rel}")
        send_file(remote, files[rel], posixpath.join(dest, rel), sums[rel], lambda n: tick(advance=n), transfer)
    return SyncReport(dest, plan.copy, plan.skip, total)


def partial_path(remote: Remote, dest: str, sha: str) -> str:
    """Where an upload accumulates: named by content, so a resumed upload appends to the same bytes.
    Through sudo the SSH user cannot write the target directory: its own /tmp file instead."""
    if remote.become.active:
        return f"/tmp/.ddops-part-{sha}"
    parent, name = posixpath.split(dest)
    return posixpath.join(parent, f".{name}.ddops-part-{sha[:16]}")


def send_file(remote: Remote, local: Path, dest: str, sha: str, advance, transfer: Transfer = Transfer()) -> None:
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
        if transfer.one_packet_writes:
            dst.MAX_REQUEST_SIZE = one_packet_request(dst.MAX_REQUEST_SIZE, sftp.sock.out_max_packet_size,
                                                      len(dst.handle))
        src.seek(done)
        while chunk := src.read(1 << 20):
            dst.write(chunk)
            advance(len(chunk))
    got = remote_sha256(remote, part, transfer)
    if got != sha:
        remote.run(f"rm -f {shlex.quote(part)}")
        raise exits.HostFailed(f"{remote.host.name}:{dest}: sha256 after upload is {got}, expected {sha}; "
                               "the partial upload was removed, run the push again")
    tmp = posixpath.join(posixpath.dirname(dest), f".{posixpath.basename(dest)}.ddops-tmp-{sha[:8]}")
    q = shlex.quote
    place = (f"install -m 644 {q(part)} {q(tmp)} && rm -f {q(part)}" if remote.become.active
             else f"chmod 644 {q(part)} && mv -f {q(part)} {q(tmp)}")
    remote.run(f"{place} && mv -f {q(tmp)} {q(dest)}")


def one_packet_request(request_size: int, max_packet: int, handle_len: int) -> int:
    """The largest SFTP write (at most request_size) whose request fits one SSH channel packet.
    paramiko sends at most the server's max packet size - 64 bytes per packet (32704 with
    OpenSSH), and a write request adds 25 bytes and the handle (length, type, id, handle,
    offset, data length): 32 KiB writes each cost a full packet plus a 93-byte one."""
    return max(1, min(request_size, max_packet - 64 - 25 - handle_len))


def push_model(remote: Remote, directory: Path, dest: str | None = None, log=print, progress=None,
               local_sums: dict[str, str] | None = None) -> SyncReport:
    """Copy a model directory to dest (default /var/lib/ddops/models/<directory name>)."""
    return sync_files(remote, local_files(directory), model_dest(directory, dest), log, progress, local_sums)


def model_dest(directory: Path, dest: str | None) -> str:
    target = dest or f"/var/lib/ddops/models/{directory.resolve().name}"
    if not posixpath.isabs(target):
        raise exits.BadInput(f"--dest {target}: must be an absolute path on the host")
    return target
