"""Fault a host change at points spread over it, and see what is left (docs/deploy.md "Lock,
killed deploys, history"):

    python -m ddops.lab.faults --host lab-1 --other lab-2 --points 5 [--fault kill|drop|freeze|contend] [--hold 45] \
        [--commands deploy,switch,shadow-start,shadow-promote,shadow-abort,rollback,rollout,rollout-refused,push-model]

For each command: a control run without a fault counts the lines it narrates and its time; then,
for each of `--points` points spread over that run (its lines, or its time for a command that
narrates fewer lines than points), the hosts are reset (production `cpu-smollm2-ar` on each, and
what the command needs: a shadow to promote or abort, a history to roll back, a second host
without the candidate's draft), the command runs again and is faulted at that point:

  kill    ddops is killed with SIGKILL;
  drop    the host's link is cut for `--hold` seconds (its veth on the lab bridge set down: packets
          are lost, no connection is reset), while ddops goes on;
  freeze  every process of the host is frozen for `--hold` seconds (the cgroup freezer: sshd and
          the service stop answering, the host's kernel still acknowledges), while ddops goes on;
  contend a second command that takes the host's lock (`ddops recover --host`) runs at that
          point, while ddops goes on: it must be refused (exit 4) wherever the change holds the
          host, so the case keeps its exit (`contended`), whether it ended before the change did
          (one that got the lock and ended first found the lock free midway), and the line the
          change had reached.

The fault is on `--host`; a rollout runs over it (its canary) and `--other`. For drop and freeze
the command's own exit code is kept (its meaning: 0 done, 1 reverted, 3 the host needs an
operator), and whether what it claimed holds. 20 s after the fault (or after the command
ended): does production answer on every host, or does `ddops status` name what was left? Then
the same command runs again (a rollback that ended done is only checked: a second one goes
further back): does it end (exit 0, 2 where nothing is left to do, 1 for the
rollout whose second host is refused) with production answering, each host on the profile the
command leads to, and nothing left (no change record, no unfinished deploy or shadow start, no
stray unit, no partial upload)? Prints one JSON line per case and a summary. Needs `ddops lab
up -n 2`; pushes SmolLM2 and the project's drafter (`make drafter`) to both hosts first.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

A, B = "cpu-smollm2-ar", "cpu-smollm2-ddtree"
MODELS = "/var/lib/ddops/models"
DRAFT = f"{MODELS}/smollm2-135m-instruct-dflash"     # B's draft, as its profile names it
PUSHED = f"{MODELS}/fault-push"                      # where push-model's cases copy SmolLM2


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


@dataclass(frozen=True)
class Command:
    """One host change the matrix faults: what runs, what the hosts need first, and what its rerun
    must leave (each host's production profile; the exits that mean it ended)."""
    argv: tuple[str, ...]
    needs: str                    # production | shadow | history | refused (the second host lacks B's draft)
    hosts: tuple[str, ...]
    final: str | None = B         # production's profile on every host once the rerun ended; None: as it was
    ends: tuple[int, ...] = (0, 2)
    reverted_keeps: bool = False  # a run that reverted (exit 1) leaves production as it was for good:
                                  # an in-place promote's shadow is gone with its failed switch, so
                                  # the rerun has nothing to promote (exit 2; rollout/shadow/lifecycle.py promote)
    idempotent: bool = True       # run again once it finished, it changes nothing; a rollback is not
                                  # (a second one goes further back: docs/deploy.md "Lock, killed
                                  # deploys, history"): after a run that ended done (exit 0) its
                                  # state is checked, not rerun


def commands(host: str, other: str, folder: Path) -> dict[str, Command]:
    """name -> the command; rollouts run over `host` (the canary) and `other`."""
    plan = folder / "fault-rollout.yaml"
    plan.write_text(json.dumps({"profile": B, "hosts": [host, other], "canary": 1, "wave_size": 1,
                                "max_failures": 0}))
    cache = Path(os.environ.get("DDOPS_CACHE", "/var/cache/ddops")) / "models" / "smollm2-135m-instruct"
    return {"deploy": Command(("deploy", B, "--host", host, "--yes"), "production", (host,)),
            "switch": Command(("switch", B, "--host", host, "--yes"), "production", (host,)),
            "shadow-start": Command(("shadow", "start", B, "--host", host, "--yes"), "production", (host,), A),
            "shadow-promote": Command(("shadow", "promote", "--yes"), "shadow", (host,), reverted_keeps=True),
            "shadow-abort": Command(("shadow", "abort", "--yes"), "shadow", (host,), A),
            "rollback": Command(("rollback", "--host", host, "--unit", "llm.service", "--yes"), "history", (host,), A,
                                idempotent=False),
            "rollout": Command(("rollout", str(plan), "--yes"), "production", (host, other)),
            # the second host refused: the halt reverts the canary, and so does every rerun (exit 1)
            "rollout-refused": Command(("rollout", str(plan), "--yes"), "refused", (host, other), A, (1,)),
            "push-model": Command(("push-model", str(cache), "--host", host, "--dest", PUSHED), "production",
                                  (host,), None, (0,))}


def on_host(host: str, command: str) -> str:
    from ddops.inventory import load_inventory
    from ddops.remote import connect
    with connect(load_inventory(None).host(host)) as remote:
        return remote.run(command, check=False).stdout


def reset(cmd: Command) -> None:
    """Settle anything left, production on A on every host (then B's shadow, B deployed over A, or
    the second host without B's draft), no rollout of the plan under way, nothing pushed yet."""
    if ddops("shadow", "status").get("shadow"):
        ddops("shadow", "abort", "--yes")
    for host in cmd.hosts:
        ddops("recover", "--host", host, "--yes")
        on_host(host, f"rm -rf {PUSHED}; [ -d {DRAFT}.hidden ] && mv {DRAFT}.hidden {DRAFT}; true")
        ddops("deploy", A, "--host", host, "--yes")
    if cmd.argv[0] == "rollout":      # its state files, `<plan stem>-<digest>.json` (rollout/fleet/loop.py)
        state = Path(os.environ.get("DDOPS_STATE") or "~/.local/state/ddops").expanduser()
        for left in (state / "rollouts").glob(f"{Path(cmd.argv[1]).stem}-*.json"):
            left.unlink()
    if cmd.needs == "shadow":
        ddops("shadow", "start", B, "--host", cmd.hosts[0], "--yes")
    elif cmd.needs == "history":
        ddops("deploy", B, "--host", cmd.hosts[0], "--yes")
    elif cmd.needs == "refused":
        on_host(cmd.hosts[1], f"mv {DRAFT} {DRAFT}.hidden")


@dataclass(frozen=True)
class Ran:
    """One narrated run of a command, and what its fault saw."""
    lines: int
    exit: int
    said: str                  # its last lines
    wall_s: float
    ended: float               # time.monotonic() when it exited
    hit: bool                  # the fault struck it running
    orphans: list[int]         # pids still holding its output 10 s after it ended: children it left behind
    struck_at: str             # the line it had said last when the fault struck
    fault_gave: object         # what the fault returned (a contender's exit and end time)


def narrated(argv: tuple[str, ...], at: int | None, fault=None, after_s: float | None = None) -> Ran:
    """Run `ddops ARGV` (narration on) and fault it after its `at`-th line, or `after_s` seconds
    for a command that narrates too little (push-model shows bars only on a terminal): SIGKILL it
    (fault None), or run `fault` (which holds the fault for its time) on a thread and let the
    command go on."""
    began = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "ddops", *argv], text=True, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env={**os.environ, "COLUMNS": "300"})
    state = {"lines": 0, "said": [], "held": None, "struck": False, "struck_at": "", "gave": None}

    def strike() -> None:
        state["struck"] = proc.poll() is None
        state["struck_at"] = state["said"][-1] if state["said"] else ""
        if fault is None:
            proc.send_signal(signal.SIGKILL)
        else:
            state["held"] = threading.Thread(target=lambda: state.update(gave=fault()), daemon=True)
            state["held"].start()

    def read() -> None:       # a thread: the output ends only when every holder of it is gone
        for line in proc.stdout:
            state["lines"] += 1
            state["said"] = (state["said"] + [line.rstrip()])[-3:]
            if at is not None and state["lines"] == at:
                strike()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    timer = threading.Timer(after_s, strike) if after_s is not None else None
    if timer:
        timer.start()
    code = proc.wait(timeout=900)
    ended = time.monotonic()
    if timer:
        timer.cancel()
    reader.join(timeout=10)
    orphans = holders(proc.stdout.fileno()) if reader.is_alive() else []
    if state["held"] is not None:
        state["held"].join()
    return Ran(state["lines"], code, " / ".join(state["said"]), ended - began, ended, state["struck"], orphans,
               state["struck_at"], state["gave"])


def holders(read_fd: int) -> list[int]:
    """Processes of this machine holding the write end of the pipe this process reads at `read_fd`."""
    pipe = os.readlink(f"/proc/self/fd/{read_fd}")
    found = []
    for fd_dir in Path("/proc").glob("[0-9]*/fd"):
        try:
            if any(os.readlink(fd) == pipe for fd in fd_dir.iterdir()) and int(fd_dir.parent.name) != os.getpid():
                found.append(int(fd_dir.parent.name))
        except OSError:
            continue        # gone, or not ours to read
    return found


def link_cut(veth: str, seconds: float) -> None:
    """The host's veth on the lab bridge down for `seconds`: its packets are lost, nothing is reset."""
    subprocess.run(["ip", "link", "set", veth, "down"], check=True)
    try:
        time.sleep(seconds)
    finally:
        subprocess.run(["ip", "link", "set", veth, "up"], check=True)


def frozen(netns: str, seconds: float) -> None:
    """Every process of the host (those in its network namespace) in a frozen freezer cgroup
    (cgroup v1 here) for `seconds`; then moved back to the root group, thawed, and the group removed."""
    root = Path("/sys/fs/cgroup/freezer")
    group = root / f"ddops-fault-{netns}"
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
        emptied(group, root)        # moved out while still frozen: none can fork back into it
        (group / "freezer.state").write_text("THAWED")
        group.rmdir()


def emptied(group: Path, root: Path) -> None:
    """Every process of a freezer group moved to the root group (a moved process takes the
    root group's state: thawed)."""
    for _ in range(20):
        pids = (group / "cgroup.procs").read_text().split()
        if not pids:
            return
        for pid in pids:
            try:
                (root / "cgroup.procs").write_text(pid)
            except OSError:
                pass    # gone meanwhile
        time.sleep(0.05)


def serving(host: str) -> bool:
    try:
        return httpx.get(f"http://{address(host)}:30000/health", timeout=5, trust_env=False).status_code == 200
    except httpx.HTTPError:
        return False


def address(host: str) -> str:
    from ddops.inventory import load_inventory
    return load_inventory(None).host(host).address


def left_on(host: str) -> tuple[list, list]:
    """What status says was left, and the units running that nothing records: any beside
    production and its shadow, and a shadow no shadow record here names."""
    status = ddops("status", "--host", host)
    record = ddops("shadow", "status").get("shadow") or {}
    stray = [u["unit"] for u in status.get("units") or [] if u.get("active") == "active"
             and (u["unit"] != "llm.service" and (u["unit"] != "llm-shadow.service" or record.get("host") != host))]
    pushing = on_host(host, f"find {PUSHED} -name '.*.ddops-*' 2>/dev/null").split()
    return status.get("interrupted") or [], stray + pushing


def profiles_on(hosts: tuple[str, ...]) -> dict[str, str | None]:
    """Each host's production profile, from its unit's header."""
    out = {}
    for host in hosts:
        units = ddops("status", "--host", host, "--unit", "llm.service").get("units") or [{}]
        out[host] = units[0].get("profile")
    return out


def case(name: str, cmd: Command, point: tuple[str, float], fault=None) -> dict:
    reset(cmd)
    before = profiles_on(cmd.hosts)
    kind, where = point
    at_line, after_s = (int(where), None) if kind == "line" else (None, where)
    ran = narrated(cmd.argv, at_line, fault, after_s)
    code = ran.exit
    time.sleep(20)
    interrupted = [f for h in cmd.hosts for f in left_on(h)[0]]
    up = all(serving(h) for h in cmd.hosts)
    unchanged = profiles_on(cmd.hosts) == before
    again = ddops(*cmd.argv) if cmd.idempotent or code != 0 else {"exit": 0, "skipped": True}
    after, stray = [], []
    for host in cmd.hosts:
        told, strays = left_on(host)
        after += told
        stray += strays
    final = profiles_on(cmd.hosts)
    wanted = before if cmd.final is None or (code == 1 and cmd.reverted_keeps) else {h: cmd.final for h in cmd.hosts}
    converged = again["exit"] in cmd.ends and all(serving(h) for h in cmd.hosts) and not after and not stray \
        and final == wanted
    contended = ran.fault_gave      # (exit, when it ended) for contend, else None
    return {"command": name, "fault_at": f"{kind} {where:g}", "hit": ran.hit, "exit": code, "said": ran.said[-300:],
            "exit_true": exit_true(code, up, interrupted, unchanged),
            "serving_20s": up, "told": bool(interrupted), "down_untold": not up and not interrupted,
            "rerun_exit": again["exit"], "converged": converged, "profiles": final, "left": after, "stray": stray,
            "orphans_here": ran.orphans, "contended": contended[0] if contended else None,
            "contended_before_end": contended[1] < ran.ended if contended else None,
            "struck_at": ran.struck_at[-200:]}


def exit_true(code: int, up: bool, interrupted: list, unchanged: bool) -> bool:
    """What the faulted command's exit said holds: 0 done (production answers, nothing left), 1
    reverted (production answers), 6 a host unreachable and nothing changed (every host on the
    profile it had, production answering), 3 the host needs a look (anything may be left); a
    killed command says nothing."""
    if code == 0:
        return up and not interrupted
    if code == 1:
        return up
    if code == 6:
        return up and unchanged
    return code in (3, -signal.SIGKILL)


def contend(host: str) -> tuple[int, float]:
    """A second command that takes the host's lock, run while the change goes on: its exit, and
    when it ended (time.monotonic())."""
    return ddops("recover", "--host", host, "--yes")["exit"], time.monotonic()


def faults(kind: str, host: str, hold: float):
    """The fault for `kind`, as case() takes it: None for kill, else a callable that holds it."""
    if kind == "kill":
        return None
    if kind == "contend":
        return lambda: contend(host)
    from ddops.lab.layout import HostSlot, LabLayout
    slot = HostSlot.of(LabLayout.from_env(), host)
    return (lambda: link_cut(slot.veth, hold)) if kind == "drop" else (lambda: frozen(slot.netns, hold))


def pushed(*hosts: str) -> None:
    """SmolLM2 and the project's drafter on every host (a push skips what is already there)."""
    cache = Path(os.environ.get("DDOPS_CACHE", "/var/cache/ddops")) / "models"
    for host in hosts:
        for name in ("smollm2-135m-instruct", "smollm2-135m-instruct-dflash"):
            if not (cache / name / "config.json").is_file():
                sys.exit(f"{cache / name} is missing: run `make models` and `make drafter` first")
            done = ddops("push-model", str(cache / name), "--host", host, "--dest", f"{MODELS}/{name}")
            if done["exit"] != 0:
                sys.exit(f"push-model {name} to {host}: {done.get('error')}")


def points_of(lines: int, wall: float, count: int) -> list[tuple[str, float]]:
    """`count` fault points spread over the control run: after its narration's lines, or over its
    wall time when it narrates too few lines to spread them (push-model: its bars, at its end)."""
    if lines >= 3 * count:
        return [("line", n) for n in sorted({max(1, round(lines * (i + 1) / (count + 1))) for i in range(count)})]
    return [("time", round(wall * (i + 1) / (count + 1), 1)) for i in range(count)]


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m ddops.lab.faults", description=__doc__.split("\n")[0])
    parser.add_argument("--host", default="lab-1")
    parser.add_argument("--other", default="lab-2", help="a rollout's second host")
    parser.add_argument("--commands", default="deploy,switch,shadow-start,shadow-promote,shadow-abort,rollback,"
                                              "rollout,push-model")
    parser.add_argument("--points", type=int, default=5)
    parser.add_argument("--fault", choices=("kill", "drop", "freeze", "contend"), default="kill")
    parser.add_argument("--hold", type=float, default=45.0, help="seconds a drop or a freeze lasts")
    args = parser.parse_args()
    use_demo_key()
    pushed(args.host, args.other)
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        table = commands(args.host, args.other, Path(folder))
        for name in args.commands.split(","):
            cmd = table[name]
            reset(cmd)
            control = narrated(cmd.argv, None)        # the control run: its lines and time
            for point in points_of(control.lines, control.wall_s, args.points):
                rows.append(case(name, cmd, point, faults(args.fault, args.host, args.hold)))
                print(json.dumps(rows[-1]), flush=True)
    print(json.dumps({"fault": args.fault, "cases": len(rows), "hit": sum(r["hit"] for r in rows),
                      "down_untold": sum(r["down_untold"] for r in rows),
                      "wrong_exit": sum(not r["exit_true"] for r in rows),
                      "not_converged": sum(not r["converged"] for r in rows),
                      "stray": sum(bool(r["stray"]) for r in rows),
                      "orphans_here": sum(bool(r["orphans_here"]) for r in rows),
                      "contended_not_refused": sum(r["contended"] not in (None, 4) for r in rows),
                      "lock_free_midway": sum(r["contended"] not in (None, 4) and r["contended_before_end"]
                                              for r in rows)}), flush=True)


if __name__ == "__main__":
    main()
