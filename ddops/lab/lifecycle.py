"""`lab up`, `lab down`, `lab status`: the lab's I/O edge, built from the pieces beside it.

State on disk (layout.state_dir): client key, known_hosts, hosts/<name>/ (host key, pid,
console.log, rootfs), rootfs/<tree>/. What runs is decided from that state and /proc, never from
memory, so a killed `lab up` is cleaned up by the next one.
"""

import ipaddress
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from ddops import systemd
from ddops.lab import access, container, inventory_file, keys, local_commands, network, rootfs
from ddops.lab.errors import LabError
from ddops.file_lock import file_lock
from ddops.lab.layout import HOST_RE, HostSlot, LabLayout, host_names

Log = Callable[[str], None]


@dataclass(frozen=True)
class HostState:
    slot: HostSlot
    pid: int | None      # supervisor PID when running
    netns: bool
    ssh: bool            # port 22 answered with an SSH banner

    @property
    def state(self) -> str:
        if self.pid and self.netns and self.ssh:
            return "running"
        return "starting" if self.pid else "stopped"


def known_slots(layout: LabLayout) -> list[HostSlot]:
    hosts = layout.state_dir / "hosts"
    names = [p.name for p in hosts.iterdir() if HOST_RE.match(p.name)] if hosts.is_dir() else []
    return sorted((HostSlot.of(layout, n) for n in names), key=lambda s: ipaddress.ip_address(s.address))


def running_slots(layout: LabLayout) -> list[HostSlot]:
    return [s for s in known_slots(layout)
            if container.supervisor_pid(layout, s.name) and network.netns_exists(s.netns)]


@contextmanager
def locked(layout: LabLayout) -> Iterator[None]:
    """One lab operation at a time per state dir (a test session and a user sharing a lab)."""
    layout.state_dir.mkdir(parents=True, exist_ok=True)
    layout.state_dir.chmod(0o700)
    with file_lock(layout.state_dir / ".lock"):
        yield


def up(layout: LabLayout, count: int, bare: bool = False, log: Log = print, ops: bool = False,
       bastion: bool = False) -> list[HostSlot]:
    """Ensure hosts lab-1..lab-N (or bare-1..bare-N) run; others already running are kept.
    ops/bastion: reach them as a sudo user, through a bastion (lab/access.py)."""
    names = host_names(count, bare)
    local_commands.require_root("ddops lab up")
    with locked(layout):
        keys.ensure_keypair(layout.client_key, "ddops-lab")
        reach = access.Access.load(layout, ops, bastion)
        if reach.bastion and bare:
            raise LabError("--bastion uses bare-1 as the bastion: bring up runtime hosts (no --bare)")
        clean_stale(layout, log)
        running = {s.name for s in running_slots(layout)}
        todo = [HostSlot.of(layout, n) for n in names if n not in running]
        if running & set(names):
            log(f"lab: keeping {', '.join(sorted(running & set(names)))} (already running)")
        bundle = None if bare else build_bundle(layout, log)
        if todo:
            boot_hosts(layout, todo, tree_for(layout, bundle, log), log)
        if reach.bastion and access.BASTION not in running:
            boot_hosts(layout, [HostSlot.of(layout, access.BASTION)], tree_for(layout, None, log), log)
        slots = running_slots(layout)
        keys.write_known_hosts(layout, slots)
        served = [s for s in slots if not (reach.bastion and s.name == access.BASTION)]
        log(f"lab: inventory {inventory_file.write(layout, served)}")
        finish_hosts(layout, [s for s in slots if s.name in names], bundle, log)
        if reach.ops:
            grant_access(layout, slots, served, reach, log)
    return served


def build_bundle(layout: LabLayout, log: Log):
    from ddops.install.wheelhouse import build_bundle as build
    return build(layout.cache_dir.parent, log)


def tree_for(layout: LabLayout, bundle, log: Log) -> Path:
    """The unpacked root filesystem to boot: base for bare hosts, base + dependency venv otherwise."""
    with file_lock(layout.cache_dir / ".lock"):
        base = rootfs.base_tarball(layout, log)
        if bundle is None:
            return rootfs.unpacked(layout, base)
        layer = rootfs.runtime_tarball(layout, base, bundle.wheelhouse.directory, bundle.wheelhouse.key, log)
        tree = rootfs.unpacked(layout, layer)
        rootfs.prune(layout, [base, layer], container.trees_in_use(), log)
        return tree


def boot_hosts(layout: LabLayout, slots: list[HostSlot], tree: Path, log: Log) -> None:
    network.ensure_bridge(layout)
    for slot in slots:
        layout.host_dir(slot.name).mkdir(parents=True, exist_ok=True)
        keys.host_key(layout, slot)
        container.fresh_disk(layout, slot.name)
        network.create_host_net(layout, slot)
        container.boot(layout, slot, tree)
        (layout.host_dir(slot.name) / "rootfs").write_text(f"{tree}\n")
        log(f"lab: {slot.name} booting at {slot.address} from {tree.name}")
    for slot in slots:
        seconds = container.wait_for_ssh(slot.address, log_path=layout.host_dir(slot.name) / "console.log")
        log(f"lab: {slot.name} answers SSH after {seconds:.1f} s")


def grant_access(layout: LabLayout, slots: list[HostSlot], served: list[HostSlot], reach, log: Log) -> None:
    """ops on every host (bastion too); with a bastion, ops only through it; the inventory says so."""
    from ddops.remote import connect
    jump = HostSlot.of(layout, access.BASTION) if reach.bastion else None
    for slot in slots:
        with connect(root_host(layout, slot)) as remote:
            access.setup_ops(remote, layout)
            if jump and slot.name != jump.name:
                access.only_through(remote, jump, layout)
    config = access.ssh_config(layout, served, jump)
    entries = {s.name: access.inventory_entry(layout, s, config) for s in served}
    inventory_file.write(layout, served, entries)
    log(f"lab: hosts reached as {access.OPS} with sudo" + (f" through {jump.name} ({jump.address})" if jump else ""))


def root_host(layout: LabLayout, slot: HostSlot):
    """How the lab itself reaches a host: root, its client key, directly."""
    from ddops.inventory import Host
    return Host(name=slot.name, address=slot.address, ssh_port=22, ssh_user="root", ssh_key=layout.client_key,
                known_hosts=layout.known_hosts)


def finish_hosts(layout: LabLayout, slots: list[HostSlot], bundle, log: Log) -> None:
    """Wait until systemd inside is up; on runtime hosts install the current project wheel."""
    from ddops.install.bundled import install_runtime
    from ddops.remote import connect
    for slot in slots:
        with connect(root_host(layout, slot)) as remote:
            state = remote.run(systemd.is_system_running(), check=False, timeout=120).stdout.strip()
            if state not in ("running", "degraded"):
                raise LabError(f"{slot.name}: systemd is {state or 'not answering'} after boot "
                               f"(see `journalctl` on the host or {layout.host_dir(slot.name)}/console.log)")
            if bundle is not None:
                report = install_runtime(remote, bundle, log=lambda _: None)
                what = "installed" if report.project_installed else "already current"
                log(f"lab: {slot.name} systemd {state}, runtime {what}")
            else:
                log(f"lab: {slot.name} systemd {state} (bare: no runtime)")


def clean_stale(layout: LabLayout, log: Log) -> None:
    """Hosts whose supervisor is gone (a killed run, a reboot of this machine) lose their leftovers."""
    live = set()
    for slot in known_slots(layout):
        if container.supervisor_pid(layout, slot.name) and network.netns_exists(slot.netns):
            live.add(slot.netns)
            continue
        if (layout.host_dir(slot.name) / "pid").exists() or network.netns_exists(slot.netns):
            log(f"lab: cleaning stale {slot.name}")
        container.halt(layout, slot)
        network.remove_host_net(slot)
    for netns in network.lab_namespaces(layout):
        if netns not in live:
            local_commands.run(["ip", "netns", "delete", netns])


def down(layout: LabLayout, log: Log = print) -> list[str]:
    """Halt every host and remove every namespace, veth, the bridge, cgroup dirs and unpacked trees."""
    local_commands.require_root("ddops lab down")
    removed = []
    with locked(layout):
        for slot in known_slots(layout):
            container.halt(layout, slot)
            network.remove_host_net(slot)
            removed.append(slot.name)
            log(f"lab: {slot.name} halted and removed")
        for netns in network.lab_namespaces(layout):
            local_commands.run(["ip", "netns", "delete", netns])
        network.remove_bridge(layout)
        inventory_file.remove(layout)
        refuse_if_mounted(layout.state_dir)
        for entry in layout.state_dir.iterdir():
            if entry.name != ".lock":
                remove_tree(entry)
    return removed


def refuse_if_mounted(path: Path) -> None:
    prefix = str(path.resolve()) + "/"
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        mount_point = line.split()[4]
        if mount_point.startswith(prefix):
            raise LabError(f"{mount_point}: still mounted; not removing the lab's files")


def remove_tree(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        local_commands.run(["rm", "-rf", "--one-file-system", str(path)])
    else:
        path.unlink(missing_ok=True)


def status(layout: LabLayout) -> list[HostState]:
    local_commands.require_root("ddops lab status")
    return [HostState(slot=s, pid=container.supervisor_pid(layout, s.name), netns=network.netns_exists(s.netns),
                      ssh=answers_ssh(s.address)) for s in known_slots(layout)]


def answers_ssh(address: str) -> bool:
    try:
        container.wait_for_ssh(address, timeout=1.0)
        return True
    except LabError:
        return False
