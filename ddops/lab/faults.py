"""Fault a host change at every point of it, and see what is left (docs/deploy.md "Lock,
killed deploys, history"):

    python -m ddops.lab.faults --host lab-1 --commands deploy,switch,shadow-promote,rollback --points 4 \
        [--fault kill|drop|freeze] [--hold 45]

For each command: a control run without a fault counts the lines it narrates; then, for each of
`--points` lines spread over that run, the host is reset (production `cpu-smollm2-ar`, and what the
command needs: a shadow to promote or abort, a history to roll back), the command is run again and
faulted once it has printed that line:

  kill    ddops is killed with SIGKILL;
  drop    the host's link is cut for `--hold` seconds (its veth on the lab bridge set down: packets
          are lost, no connection is reset), while ddops goes on;
  freeze  every process of the host is frozen for `--hold` seconds (the cgroup freezer: sshd and
          the service stop answering, the host's kernel still acknowledges), while ddops goes on.

For drop and freeze the command's own exit code is kept (its meaning: 0 done, 1 reverted, 3 the
host needs an operator), and whether what it claimed holds. 20 s after the fault (or after the
command ended): does production answer, or does `ddops status` name what was left? Then the same
command is run again: does it end with exit 0 (or 2 where there is nothing left to do),
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
import threading
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


def narrated(argv: list[str], at: int | None, fault=None) -> tuple[int, int, str]:
    """Run `ddops ARGV` (narration on) and fault it after its `at`-th line: SIGKILL it (fault
    None), or run `fault` (which holds the fault for its time) on a thread and let the command
    go on; (lines, exit, its last lines)."""
    proc = subprocess.Popen([sys.executable, "-m", "ddops", *argv], text=True, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env={**os.environ, "COLUMNS": "300"})
    lines, said, held = 0, [], None
    for line in proc.stdout:
        lines += 1
        said = (said + [line.rstrip()])[-3:]
        if at is not None and lines == at:
            if fault is None:
                proc.send_signal(signal.SIGKILL)
                break
            held = threading.Thread(target=fault, daemon=True)
            held.start()
    code = proc.wait(timeout=900)
    if held is not None:
        held.join()
    return lines, code, " / ".join(said)


def link_cut(veth: str, seconds: float) -> None:
    """The host's veth on the lab bridge down for `seconds`: its packets are lost, nothing is reset."""
    subprocess.run(["ip", "link", "set", veth, "down"], check=True)
    try:
        time.sleep(seconds)
    finally:
        subprocess.run(["ip", "link", "set", veth, "up"], check=True)


def frozen(netns: str, seconds: float) -> None:
    """Every process of the host (those in its network namespace) in a frozen freezer cgroup
    (cgroup v1 here) for `seconds`; thawed after, and left in that cgroup (it changes nothing else)."""
    group = Path("/sys/fs/cgroup/freezer") / f"ddops-fault-{netns}"
    group.mkdir(exist_ok=True)
    pids = subprocess.run(["ip", "netns", "pids", netns], capture_output=True, text=True, check=True).stdout.split()
    for pid in pids:
        try:
            (group / "cgroup.procs").write_text(pid)
        except OSError:
            pass        # gone since listed
    (group / "freezer.state").write_text("FROZEN")
    try:
        time.sleep(seconds)
    finally:
        (group / "freezer.state").write_text("THAWED")


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


def case(host: str, name: str, argv: list[str], needs: str, point: int, url: str, fault=None) -> dict:
    reset(host, needs)
    lines, code, said = narrated(argv, point, fault)
    hit = code == -signal.SIGKILL if fault is None else lines > point
    time.sleep(20)
    interrupted, _ = left_on(host)
    up = serving(url)
    again = ddops(*argv)
    after, stray = left_on(host)
    converged = again["exit"] in (0, 2) and serving(url) and not after and not stray
    return {"command": name, "fault_after_line": point, "hit": hit, "exit": code, "said": said[-300:],
            "exit_true": exit_true(code, up, interrupted),
            "serving_20s": up, "told": bool(interrupted), "down_untold": not up and not interrupted,
            "rerun_exit": again["exit"], "converged": converged, "left": after, "stray": stray}


def exit_true(code: int, up: bool, interrupted: list) -> bool:
    """What the faulted command's exit said holds: 0 done (production answers, nothing left), 1
    reverted (production answers), 3 or 6 the host needs a look (anything may be left); a killed
    command says nothing."""
    if code == 0:
        return up and not interrupted
    if code == 1:
        return up
    return code in (3, 6, -signal.SIGKILL)


def faults(kind: str, host: str, hold: float):
    """The fault for `kind`, as case() takes it: None for kill, else a callable that holds it."""
    if kind == "kill":
        return None
    from ddops.lab.layout import HostSlot, LabLayout
    slot = HostSlot.of(LabLayout.from_env(), host)
    return (lambda: link_cut(slot.veth, hold)) if kind == "drop" else (lambda: frozen(slot.netns, hold))


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m ddops.lab.faults", description=__doc__.split("\n")[0])
    parser.add_argument("--host", default="lab-1")
    parser.add_argument("--commands", default=",".join(commands("x")))
    parser.add_argument("--points", type=int, default=5)
    parser.add_argument("--fault", choices=("kill", "drop", "freeze"), default="kill")
    parser.add_argument("--hold", type=float, default=45.0, help="seconds a drop or a freeze lasts")
    args = parser.parse_args()
    use_demo_key()
    from ddops.inventory import load_inventory
    url = f"http://{load_inventory(None).host(args.host).address}:30000"
    table, rows = commands(args.host), []
    for name in args.commands.split(","):
        argv, needs = table[name]
        reset(args.host, needs)
        total, _, _ = narrated(argv, None)        # the control run: how many lines it narrates
        points = sorted({max(1, round(total * (i + 1) / (args.points + 1))) for i in range(args.points)})
        for point in points:
            rows.append(case(args.host, name, argv, needs, point, url, faults(args.fault, args.host, args.hold)))
            print(json.dumps(rows[-1]), flush=True)
    print(json.dumps({"fault": args.fault, "cases": len(rows), "hit": sum(r["hit"] for r in rows),
                      "down_untold": sum(r["down_untold"] for r in rows),
                      "wrong_exit": sum(not r["exit_true"] for r in rows),
                      "not_converged": sum(not r["converged"] for r in rows),
                      "stray": sum(bool(r["stray"]) for r in rows)}), flush=True)


if __name__ == "__main__":
    main()
