"""Kill ddops at every point of a host change, and see what is left (docs/deploy.md "Lock,
killed deploys, history"):

    python -m ddops.lab.faults --host lab-1 --commands deploy,switch,shadow-promote,rollback --points 4

For each command: a control run without a fault counts the lines it narrates; then, for each of
`--points` lines spread over that run, the host is reset (production `cpu-smollm2-ar`, and what the
command needs: a shadow to promote or abort, a history to roll back), the command is run again and
killed with SIGKILL once it has printed that line. 20 s later: does production answer, or does
`ddops status` name what was left? Then the same command is run again: does it end with exit 0,
production answering and nothing left (no change record, no unfinished deploy, no stray unit)?
Prints one JSON line per case and a summary. Needs `ddops lab up`, and SmolLM2 and the project's
drafter pushed (`python -m ddops.lab.bench_shadow_gate` pushes them).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

A, B = "cpu-smollm2-ar", "cpu-smollm2-ddtree"


def use_demo_key() -> None:
    """The cpu-* profiles read $DDOPS_API_KEY; unset, the key `make demo` made is used."""
    kept = Path(os.environ.get("DDOPS_CACHE", "/var/cache/ddops")) / "demo-api-key"
    if not os.environ.get("DDOPS_API_KEY"):
        if not kept.is_file():
            sys.exit("set DDOPS_API_KEY (the cpu-* profiles read it), or run `make demo` once")
        os.environ["DDOPS_API_KEY"] = kept.read_text().strip()


def ddops(*args: str, timeout: float = 900) -> dict:
    done = subprocess.run([sys.executable, "-m", "ddops", *args, "--json"], capture_output=True, text=True,
                          stdin=subprocess.DEVNULL, timeout=timeout)
    doc = json.loads(done.stdout) if done.stdout.strip() else {"error": done.stderr[-300:]}
    return {**doc, "exit": done.returncode}


def commands(host: str) -> dict[str, tuple[list[str], str]]:
    """name -> (argv, what the host needs first: production only, a shadow, or a history to roll back)."""
    return {"deploy": (["deploy", B, "--host", host, "--yes"], "production"),
            "switch": (["switch", B, "--host", host, "--yes"], "production"),
            "shadow-start": (["shadow", "start", B, "--host", host, "--yes"], "production"),
            "shadow-promote": (["shadow", "promote", "--yes"], "shadow"),
            "shadow-abort": (["shadow", "abort", "--yes"], "shadow"),
            "rollback": (["rollback", "--host", host, "--unit", "llm.service", "--yes"], "history")}


def reset(host: str, needs: str) -> None:
    """Settle anything left, production on A (and B's shadow, or B deployed over A)."""
    ddops("recover", "--host", host, "--yes")
    if ddops("shadow", "status").get("shadow"):
        ddops("shadow", "abort", "--yes")
    ddops("deploy", A, "--host", host, "--yes")
    if needs == "shadow":
        ddops("shadow", "start", B, "--host", host, "--yes")
    elif needs == "history":
        ddops("deploy", B, "--host", host, "--yes")


def narrated(argv: list[str], kill_at: int | None) -> tuple[int, int]:
    """Run `ddops ARGV` (narration on), SIGKILL it after its `kill_at`-th line; (lines, exit)."""
    proc = subprocess.Popen([sys.executable, "-m", "ddops", *argv], text=True, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env={**os.environ, "COLUMNS": "300"})
    lines = 0
    for _ in proc.stdout:
        lines += 1
        if kill_at is not None and lines >= kill_at:
            proc.send_signal(signal.SIGKILL)
            break
    return lines, proc.wait(timeout=900)


def serving(url: str) -> bool:
    try:
        return httpx.get(url + "/health", timeout=5, trust_env=False).status_code == 200
    except httpx.HTTPError:
        return False


def left_on(host: str) -> tuple[list, list]:
    """What status says was left, and the units running beside production and its shadow."""
    status = ddops("status", "--host", host)
    stray = [u["unit"] for u in status.get("units") or [] if u.get("active") == "active"
             and u["unit"] not in ("llm.service", "llm-shadow.service")]
    return status.get("interrupted") or [], stray


def case(host: str, name: str, argv: list[str], needs: str, point: int, url: str) -> dict:
    reset(host, needs)
    lines, code = narrated(argv, point)
    killed = code == -signal.SIGKILL
    time.sleep(20)
    interrupted, _ = left_on(host)
    up = serving(url)
    again = ddops(*argv)
    after, stray = left_on(host)
    converged = again["exit"] in (0, 2) and serving(url) and not after and not stray
    return {"command": name, "kill_after_line": point, "killed": killed, "serving_20s": up,
            "told": bool(interrupted), "down_untold": not up and not interrupted,
            "rerun_exit": again["exit"], "converged": converged, "left": after, "stray": stray}


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m ddops.lab.faults", description=__doc__.split("\n")[0])
    parser.add_argument("--host", default="lab-1")
    parser.add_argument("--commands", default=",".join(commands("x")))
    parser.add_argument("--points", type=int, default=5)
    args = parser.parse_args()
    use_demo_key()
    from ddops.inventory import load_inventory
    url = f"http://{load_inventory(None).host(args.host).address}:30000"
    table, rows = commands(args.host), []
    for name in args.commands.split(","):
        argv, needs = table[name]
        reset(args.host, needs)
        total, _ = narrated(argv, None)        # the control run: how many lines it narrates
        points = sorted({max(1, round(total * (i + 1) / (args.points + 1))) for i in range(args.points)})
        for point in points:
            rows.append(case(args.host, name, argv, needs, point, url))
            print(json.dumps(rows[-1]), flush=True)
    print(json.dumps({"cases": len(rows), "killed": sum(r["killed"] for r in rows),
                      "down_untold": sum(r["down_untold"] for r in rows),
                      "not_converged": sum(not r["converged"] for r in rows),
                      "stray": sum(bool(r["stray"]) for r in rows)}), flush=True)


if __name__ == "__main__":
    main()
