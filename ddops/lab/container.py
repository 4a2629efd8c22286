"""Boot and halt one lab host: systemd-nspawn with systemd as PID 1 inside the host's namespace.

A small supervisor shell (its PID is the host's pid file) moves itself into the host's own
cgroup, boots the container and boots it again when systemd inside asks for a reboot (exit 133).
SIGTERM to the supervisor halts the container cleanly.
"""

import os
import shlex
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

from ddops.lab import local_commands
from ddops.lab.errors import LabError
from ddops.lab.layout import HostSlot, LabLayout

CGROUP_ROOT = Path("/sys/fs/cgroup")
MARKER = "ddops-lab-supervisor"
SUPERVISOR = """\
# MARKER
for dir in "$@"; do echo $$ > "$dir/cgroup.procs"; done
trap 'kill -TERM $child 2>/dev/null; wait $child; exit 0' TERM
while :; do
  systemd-nspawn "${NSPAWN[@]}" --uuid="$(cat /proc/sys/kernel/random/uuid)" & child=$!
  wait $child; rc=$?
  [ $rc = 133 ] || exit $rc
done
""".replace("MARKER", MARKER)


def cgroup_dirs(layout: LabLayout, name: str) -> list[Path]:
    """One cgroup per host in the named-systemd and unified hierarchies (or the single v2 tree):
    else every container shares the caller's cgroup and systemd inside them sees each other."""
    if (CGROUP_ROOT / "cgroup.controllers").exists():
        return [CGROUP_ROOT / layout.prefix / name]
    return [CGROUP_ROOT / h / layout.prefix / name for h in ("systemd", "unified") if (CGROUP_ROOT / h).is_dir()]


# Folders a lab host keeps on this machine's disk instead of its RAM overlay (--volatile=overlay
# writes to a tmpfs): SGLang's CPU venv is 6 GB (ddops/install/sglang.py).
DISK_FOLDERS = ("/opt/sglang",)


def disk_dir(layout: LabLayout, name: str, folder: str) -> Path:
    return layout.host_dir(name) / "disk" / folder.strip("/").replace("/", "-")


def fresh_disk(layout: LabLayout, name: str) -> None:
    """A newly booted host starts with empty disk folders, as a new machine would."""
    for folder in DISK_FOLDERS:
        path = disk_dir(layout, name, folder)
        shutil.rmtree(path, ignore_errors=True)
        path.mkdir(parents=True)


def nspawn_args(layout: LabLayout, slot: HostSlot, rootfs: Path) -> list[str]:
    host_dir = layout.host_dir(slot.name)
    disks = [f"--bind={disk_dir(layout, slot.name, folder)}:{folder}" for folder in DISK_FOLDERS]
    binds = [(host_dir / "ssh_host_ed25519_key", "/etc/ssh/ssh_host_ed25519_key"),
             (host_dir / "ssh_host_ed25519_key.pub", "/etc/ssh/ssh_host_ed25519_key.pub"),
             (layout.client_key.with_suffix(".pub"), "/root/.ssh/authorized_keys")]
    return ["-q", "-D", str(rootfs), "--volatile=overlay", "--register=no", "--keep-unit", "-b",
            "-M", slot.netns, f"--hostname={slot.name}", f"--network-namespace-path=/run/netns/{slot.netns}", "--console=read-only",
            *(f"--bind-ro={src}:{dst}" for src, dst in binds), *disks]


def boot(layout: LabLayout, slot: HostSlot, rootfs: Path) -> int:
    """Start the supervisor; returns its PID (also written to the host's pid file)."""
    host_dir = layout.host_dir(slot.name)
    cgroups = cgroup_dirs(layout, slot.name)
    for cg in cgroups:
        cg.mkdir(parents=True, exist_ok=True)
    argv = ["bash", "-c", f"NSPAWN=({' '.join(map(shlex.quote, nspawn_args(layout, slot, rootfs)))})\n{SUPERVISOR}",
            MARKER, *map(str, cgroups)]
    with open(host_dir / "console.log", "ab") as log:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)
    (host_dir / "pid").write_text(f"{proc.pid}\n")
    return proc.pid


def supervisor_pid(layout: LabLayout, name: str) -> int | None:
    """The PID from the host's pid file if that process is still our supervisor, else None."""
    try:
        pid = int((layout.host_dir(name) / "pid").read_text())
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (OSError, ValueError):
        return None
    return pid if MARKER.encode() in cmdline else None


def trees_in_use() -> set[Path]:
    """Root filesystem trees any systemd-nspawn on this machine (any lab, any version) is running from."""
    used = set()
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            args = cmdline.read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        if args[0].endswith("systemd-nspawn") and "-D" in args[:-1]:
            used.add(Path(args[args.index("-D") + 1]))
    return used


def wait_for_ssh(address: str, timeout: float = 60.0, log_path: Path | None = None) -> float:
    """Seconds until port 22 at address answers with an SSH banner."""
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        try:
            with socket.create_connection((address, 22), timeout=2) as sock:
                sock.settimeout(5)
                if sock.recv(4).startswith(b"SSH-"):
                    return time.monotonic() - start
        except OSError:
            pass
        time.sleep(0.2)
    raise LabError(f"{address}:22: no SSH banner after {timeout:.0f} s (boot log: {log_path or 'console.log in the lab dir'})")


def halt(layout: LabLayout, slot: HostSlot, timeout: float = 20.0) -> None:
    """SIGTERM the supervisor (clean halt, ~2 s), SIGKILL its whole session if it lingers; then the cgroups."""
    pid = supervisor_pid(layout, slot.name)
    if pid is not None:
        os.kill(pid, signal.SIGTERM)
        if not wait_gone(pid, timeout):
            os.killpg(pid, signal.SIGKILL)
            wait_gone(pid, 5)
    kill_cgroup_members(layout, slot.name)
    remove_cgroups(layout, slot.name)
    remove_dir(Path("/run/systemd/nspawn/propagate") / slot.netns)   # nspawn's, per machine name
    (layout.host_dir(slot.name) / "pid").unlink(missing_ok=True)


def wait_gone(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not Path(f"/proc/{pid}").exists() or b"Z" in zombie_state(pid):
            try:
                os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                pass
            return True
        time.sleep(0.1)
    return False


def zombie_state(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1][:3]
    except OSError:
        return b"Z"


def kill_cgroup_members(layout: LabLayout, name: str) -> None:
    """Anything still in the host's cgroups after the halt (a killed run's leftovers) gets SIGKILL."""
    for cg in cgroup_dirs(layout, name):
        for procs in cg.rglob("cgroup.procs") if cg.exists() else []:
            for pid in procs.read_text().split():
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except ProcessLookupError:
                    pass


def remove_cgroups(layout: LabLayout, name: str) -> None:
    """rmdir depth-first (cgroup dirs cannot be removed recursively); then the prefix dir if empty."""
    for cg in cgroup_dirs(layout, name):
        for attempt in range(50):
            if not cg.exists():
                break
            dirs = sorted((p for p in cg.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True)
            try:
                for d in [*dirs, cg]:
                    d.rmdir()
            except OSError:
                time.sleep(0.1)
        try:
            cg.parent.rmdir()
        except OSError:
            pass
        if cg.exists():
            raise LabError(f"{cg}: cgroup still busy after the halt")


def remove_dir(path: Path) -> None:
    if path.is_dir():
        local_commands.run(["rm", "-rf", "--one-file-system", str(path)], check=False)
