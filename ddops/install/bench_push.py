"""Benchmark: push a model to N hosts in parallel vs to one host, same run, same model.

    python -m ddops.install.bench_push [--hosts lab-1,lab-2,lab-3,lab-4] [--model DIR] [--inventory PATH]

Each timing starts from an empty destination on every host (nothing to skip or resume) and
ends when every file is sha256-verified in place. Prints both wall times and their ratio
(the goal of issue 13: N=4 hosts within 1.5x of one).
"""

from __future__ import annotations

import argparse
import io
import os
import time
from pathlib import Path

from rich.console import Console

from ddops.install.many import push_model_many
from ddops.inventory import load_inventory
from ddops.remote import connect

DEST = "/var/lib/ddops/models/bench-push"


def clear(hosts: list) -> None:
    for host in hosts:
        with connect(host) as remote:
            remote.run(f"rm -rf {DEST} /var/lib/ddops/models/.bench-push.ddops-part-* /tmp/.ddops-part-*")


def timed_push(hosts: list, model: Path) -> float:
    clear(hosts)
    start = time.monotonic()
    outcomes = push_model_many(hosts, model, DEST, console=Console(file=io.StringIO()))
    took = time.monotonic() - start
    failed = [o for o in outcomes if not o.ok]
    if failed:
        raise SystemExit(f"push failed: {failed[0].host}: {failed[0].detail}")
    return took


def main() -> None:
    cache = Path(os.environ.get("DDOPS_CACHE", "/var/cache/ddops"))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", default="lab-1,lab-2,lab-3,lab-4")
    parser.add_argument("--model", type=Path, default=cache / "models" / "smollm2-135m-instruct")
    parser.add_argument("--inventory", type=Path, default=None)
    args = parser.parse_args()
    inventory = load_inventory(args.inventory)
    hosts = [inventory.host(name.strip()) for name in args.hosts.split(",")]
    size = sum(p.stat().st_size for p in args.model.rglob("*") if p.is_file())
    one = timed_push(hosts[:1], args.model)
    many = timed_push(hosts, args.model)
    clear(hosts)
    print(f"push-model {args.model.name} ({size / 1e6:.1f} MB): 1 host {one:.2f} s "
          f"({size / one / 1e6:.1f} MB/s); {len(hosts)} hosts in parallel {many:.2f} s "
          f"({len(hosts) * size / many / 1e6:.1f} MB/s total); ratio {many / one:.2f}x (goal <= 1.5x)")


if __name__ == "__main__":
    main()
