"""Benchmark: push a model to N hosts in parallel vs to one host, same run, same model.

    python -m ddops.lab.bench_push [--hosts lab-1,lab-2,lab-3,lab-4] [--model DIR] [--inventory PATH] [--levers]

Each timing runs the push in a fresh process (interpreter start, imports and local checksums
included, as a `ddops push-model` pays them), starts from an empty destination on every host
(nothing to skip or resume) and ends when every file is sha256-verified in place. Prints both wall times and their ratio
(the goal of issue 13: N=4 hosts within 1.5x of one), the CPU seconds the pushing processes
used, and for lab hosts the CPU seconds of their containers (sshd, sftp-server, sha256).
--levers times the transfer as it was before each lever, adding one lever per row.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import resource
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from rich.console import Console

from ddops.install.many import push_model_many
from ddops.install.sync import Transfer
from ddops.inventory import load_inventory
from ddops.remote import connect

DEST = "/var/lib/ddops/models/bench-push"
BEFORE = Transfer(one_packet_writes=False, fast_sha256=False, ciphers=())   # paramiko's order: aes128-ctr
LEVERS = {"transfer as before (aes128-ctr, 32 KiB writes, sha256sum)": BEFORE,
          "+ aes128-gcm first": Transfer(one_packet_writes=False, fast_sha256=False),
          "+ one-packet SFTP writes": Transfer(fast_sha256=False),
          "+ openssl sha256 on the host (= now)": Transfer()}


@dataclass(frozen=True)
class Timing:
    wall_s: float
    client_cpu_s: float     # the pushing process and its children
    host_cpu_s: float | None


def clear(hosts: list) -> None:
    for host in hosts:
        with connect(host) as remote:
            remote.run(f"rm -rf {DEST} /var/lib/ddops/models/.bench-push.ddops-part-* /tmp/.ddops-part-*")


def lab_cpu_s(hosts: list) -> float | None:
    """CPU seconds used so far by the lab containers of hosts (their cgroups), None elsewhere."""
    from ddops.lab.container import cgroup_dirs
    from ddops.lab.layout import LabLayout
    layout, total = LabLayout.from_env(), 0.0
    for host in hosts:
        stats = [d / "cpu.stat" for d in cgroup_dirs(layout, host.name) if (d / "cpu.stat").is_file()]
        if not stats:
            return None
        total += int(stats[0].read_text().split()[1]) / 1e6     # usage_usec
    return total


def children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def timed_push(hosts: list, model: Path, transfer: Transfer, inventory: Path | None) -> Timing:
    clear(hosts)
    command = [sys.executable, "-m", "ddops.lab.bench_push", "--push", ",".join(h.name for h in hosts),
               "--model", str(model), "--transfer", json.dumps(asdict(transfer)),
               *(["--inventory", str(inventory)] if inventory else [])]
    host0, client0, start = lab_cpu_s(hosts), children_cpu_s(), time.monotonic()
    done = subprocess.run(command, capture_output=True, text=True)
    took, client = time.monotonic() - start, children_cpu_s() - client0
    host1 = lab_cpu_s(hosts)
    if done.returncode != 0:
        raise SystemExit(f"push failed: {done.stderr.strip() or done.stdout.strip()}")
    return Timing(took, client, None if host0 is None or host1 is None else host1 - host0)


def push(hosts: list, model: Path, transfer: dict) -> None:
    """The timed part, in its own process."""
    outcomes = push_model_many(hosts, model, DEST, console=Console(file=io.StringIO()),
                               transfer=Transfer(**{**transfer, "ciphers": tuple(transfer["ciphers"])}))
    from multiprocessing import forkserver
    forkserver._forkserver._stop()      # reaped here, so its children's CPU counts in this process's
    failed = [o for o in outcomes if not o.ok]
    if failed:
        raise SystemExit(f"{failed[0].host}: {failed[0].detail}")


def line(label: str, size: int, n: int, one: Timing, many: Timing) -> str:
    host = f"{many.host_cpu_s:.1f}" if many.host_cpu_s is not None else "n/a"
    text = (f"{label}: 1 host {one.wall_s:.2f} s ({size / one.wall_s / 1e6:.0f} MB/s); {n} hosts {many.wall_s:.2f} s "
            f"({n * size / many.wall_s / 1e6:.0f} MB/s total, CPU s: pushers {many.client_cpu_s:.1f}, hosts {host}); "
            f"ratio {many.wall_s / one.wall_s:.2f}x")
    if many.host_cpu_s is None:
        return text
    # Lab hosts share this machine's cores with the pushers: all that CPU cannot take less wall time.
    cores = os.cpu_count() or 1
    floor = (many.client_cpu_s + many.host_cpu_s) / cores
    return text + f"; CPU floor on {cores} cores {floor:.1f} s ({floor / one.wall_s:.2f}x)"


def main() -> None:
    cache = Path(os.environ.get("DDOPS_CACHE", "/var/cache/ddops"))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", default="lab-1,lab-2,lab-3,lab-4")
    parser.add_argument("--model", type=Path, default=cache / "models" / "smollm2-135m-instruct")
    parser.add_argument("--inventory", type=Path, default=None)
    parser.add_argument("--levers", action="store_true", help="one row per lever, from before the first")
    parser.add_argument("--push", help=argparse.SUPPRESS)        # the timed child: these hosts
    parser.add_argument("--transfer", help=argparse.SUPPRESS)
    args = parser.parse_args()
    inventory = load_inventory(args.inventory)
    if args.push:
        return push([inventory.host(n) for n in args.push.split(",")], args.model, json.loads(args.transfer))
    hosts = [inventory.host(name.strip()) for name in args.hosts.split(",")]
    size = sum(p.stat().st_size for p in args.model.rglob("*") if p.is_file())
    print(f"push-model {args.model.name} ({size / 1e6:.1f} MB), goal: {len(hosts)} hosts within 1.5x of one")
    for label, transfer in (LEVERS.items() if args.levers else [("now", Transfer())]):
        one = timed_push(hosts[:1], args.model, transfer, args.inventory)
        many = timed_push(hosts, args.model, transfer, args.inventory)
        print(line(label, size, len(hosts), one, many), flush=True)
    clear(hosts)


if __name__ == "__main__":
    main()
