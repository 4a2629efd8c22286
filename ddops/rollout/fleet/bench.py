"""Fleet figure: wall time of a rollout to 1 host vs to N hosts at once (one wave).

    python -m ddops.rollout.fleet.bench --base cpu-ar --profile cpu-ddtree --hosts lab-1,lab-2,lab-3,lab-4

Needs lab hosts (or any inventory hosts) that can run both profiles. Each timed rollout starts
from every host on --base, so both measure the same change. Prints the figures and the ratio;
asserts nothing.
"""

from __future__ import annotations

import argparse
import io
import json
import tempfile
import time
from pathlib import Path

import yaml

from ddops.rollout.fleet.run_plan import run_plan
from ddops.rollout.output import Output


def rollout(profile: str, hosts: list[str], workdir: Path, inventory: Path | None) -> tuple[int, float]:
    plan = workdir / f"{profile}-{len(hosts)}-{time.monotonic_ns()}.yaml"
    plan.write_text(yaml.safe_dump({"profile": profile, "hosts": hosts, "canary": 0,
                                    "wave_size": len(hosts), "max_failures": 0, "bake_s": 0}))
    stream = io.StringIO()
    started = time.monotonic()
    code = run_plan(plan, inventory=inventory, restart=True, yes=True,
                    out=Output(json_doc=True, stream=stream))
    wall = time.monotonic() - started
    if code != 0:
        raise SystemExit(f"rollout of {profile} to {hosts} exited {code}: {stream.getvalue()[:2000]}")
    return code, wall


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(prog="python -m ddops.rollout.fleet.bench", description=__doc__.splitlines()[0])
    ap.add_argument("--base", default="cpu-ar", help="profile every host runs before each timed rollout")
    ap.add_argument("--profile", default="cpu-ddtree", help="profile rolled out (timed)")
    ap.add_argument("--hosts", default="lab-1,lab-2,lab-3,lab-4")
    ap.add_argument("--inventory", type=Path, default=None)
    args = ap.parse_args(argv)
    hosts = args.hosts.split(",")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        rollout(args.base, hosts, work, args.inventory)
        _, one = rollout(args.profile, hosts[:1], work, args.inventory)
        rollout(args.base, hosts, work, args.inventory)
        _, many = rollout(args.profile, hosts, work, args.inventory)
        rollout(args.base, hosts, work, args.inventory)
    print(json.dumps({"profile": args.profile, "hosts": len(hosts), "wall_1_host_s": round(one, 2),
                      f"wall_{len(hosts)}_hosts_s": round(many, 2), "ratio": round(many / one, 2)}))
    print(f"rollout of {args.profile}: 1 host {one:.1f} s, {len(hosts)} hosts {many:.1f} s, "
          f"ratio {many / one:.2f} (ideal parallel 1.00, sequential {len(hosts):.2f})")


if __name__ == "__main__":
    main()
