"""Host changes killed midway (kill -9 of ddops at a named stage), or whose host freezes or loses
its link while they go on, on real lab hosts: `ddops status` names what was left and the command
that settles it, and the next command converges. A representative set for `make test` of what
`python -m ddops.lab.faults` runs in full (docs/deploy.md, "Lock, killed deploys, history").

The fault lands when the command reports the stage (its --json-events line, or the narration
line of a command without events), so the host is between that stage's step and the next."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import pytest
import yaml

from ddops.render import read_header
from tests.rollout.test_lab_rollout import DRAFT, SHADOW_UNIT, lab, write  # noqa: F401 (the module's lab fixture)

pytestmark = pytest.mark.lab
RB_UNIT = "/etc/systemd/system/rb.service"
PENDING = "/var/lib/ddops/deploy/llm.service/pending.json"


def kill_at(lab, marker: str, *args: str) -> str:
    """Run `ddops ARGS`, SIGKILL it when a line of its output holds `marker`; its output so far."""
    from tests.fixtures_lab import REPO
    proc = subprocess.Popen([sys.executable, "-m", "ddops", *args], cwd=REPO, text=True,
                            env={**os.environ, **lab.env, "COLUMNS": "400"},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    seen = []
    for line in proc.stdout:
        seen.append(line)
        if marker in line:
            proc.send_signal(signal.SIGKILL)
            break
    proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL, f"{args} ended before {marker!r}:\n{''.join(seen)}"
    return "".join(seen)


def faulted_at(lab, marker: str, fault, *args: str) -> tuple[int, str]:
    """Run `ddops ARGS`; when a line holds `marker`, hold `fault` on a thread while the command
    goes on; (its exit, its output)."""
    from tests.fixtures_lab import REPO
    proc = subprocess.Popen([sys.executable, "-m", "ddops", *args], cwd=REPO, text=True,
                            env={**os.environ, **lab.env, "COLUMNS": "400"},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    seen, held = [], None
    for line in proc.stdout:
        seen.append(line)
        if held is None and marker in line:
            held = threading.Thread(target=fault)
            held.start()
    code = proc.wait(timeout=600)
    assert held is not None, f"{args} ended before {marker!r}:\n{''.join(seen)}"
    held.join()
    return code, "".join(seen)


def slot(lab, host: str, monkeypatch):
    """The test lab's plumbing for `host` (its veth on the bridge, its network namespace)."""
    from ddops.lab.layout import HostSlot, LabLayout
    for key, value in lab.env.items():
        monkeypatch.setenv(key, value)
    return HostSlot.of(LabLayout.from_env(), host)


def converges(lab, code: int, host: str, rerun: tuple[str, ...], said: str) -> None:
    """What a change's exit under a fault promises: 0, done and nothing left; 3, the host needs a
    look, and `ddops status` names what was left, which the same command run again settles; 6,
    no connection opened and nothing changed, so the same command run again does it."""
    assert code in (0, 3, 6), said
    if code == 3:
        assert told(lab, host), f"exit 3 with nothing told:\n{said}"
    if code != 0:
        lab.json(*rerun, "--yes", expect=0)
    assert lab.json("status", "--host", host, expect=0)["interrupted"] == []


def told(lab, host: str) -> list[dict]:
    """What `ddops status` says was left; the host's end of the killed SSH channel closes a moment
    after the kill, and until then the lock reads as held (a live change, not a left one)."""
    deadline = time.monotonic() + 20
    while True:
        left = lab.json("status", "--host", host, expect=0)["interrupted"]
        if left or time.monotonic() > deadline:
            return left
        time.sleep(0.5)


def settled_first(lab, host: str) -> None:
    """What other suites' cut connections left on the shared lab host is settled before a case."""
    lab.json("recover", "--host", host, "--yes", expect=0)


def test_a_switch_killed_after_stopping_production_is_told_then_undone(lab):
    settled_first(lab, "lab-2")
    lab.deploy("cpu-ar", "lab-2")
    before = lab.unit("lab-2")
    kill_at(lab, '"stage": "gpu"', "switch", lab.profile("ro-other"), "--host", "lab-2", "--yes", "--json-events")

    [left] = told(lab, "lab-2")
    assert left["what"].startswith("ddops switch") and left["production"] == ["llm.service"]
    assert left["next"] == "ddops recover --host lab-2"
    preview = lab.json("recover", "--host", "lab-2", "--dry-run", expect=0)["steps"]
    assert preview[0].startswith("undo `ddops switch") and "start llm.service" in preview[0]
    assert told(lab, "lab-2") == [left]                       # the dry run settled nothing
    settled = lab.json("recover", "--host", "lab-2", "--yes", expect=0)["settled"]
    assert any(s.startswith("undid the interrupted `ddops switch") for s in settled), settled
    assert lab.unit("lab-2") == before                       # production as it was, byte for byte
    assert lab.info("lab-2")["model_path"] == "/var/lib/ddops/models/tiny-llama"   # and serving
    assert lab.json("status", "--host", "lab-2", expect=0)["interrupted"] == []


def test_a_switch_dry_run_shows_its_steps_and_touches_nothing(lab):
    lab.deploy("cpu-ar", "lab-2")
    unit, pid = lab.unit("lab-2"), lab.main_pid("lab-2")
    shown = lab.json("switch", lab.profile("ro-other"), "--host", "lab-2", "--dry-run", expect=0)
    assert [s["action"] for s in shown["steps"]] == [
        "snapshot", "record-change", "stop", "gpu-wait", "deploy backup", "deploy write-unit", "deploy write-env",
        "deploy reload-enable", "deploy restart", "deploy gate", "deploy record", "end-change"]
    assert shown["from"] == shown["to"] == "llm.service" and "tiny-llama-other" in shown["deploy"]["unit_diff"]
    assert lab.unit("lab-2") == unit and lab.main_pid("lab-2") == pid


def test_a_switch_killed_midway_is_settled_by_the_next_switch(lab):
    settled_first(lab, "lab-2")
    lab.deploy("cpu-ar", "lab-2")
    kill_at(lab, '"stage": "gpu"', "switch", lab.profile("ro-other"), "--host", "lab-2", "--yes", "--json-events")
    again = lab.json("switch", lab.profile("ro-other"), "--host", "lab-2", "--yes", expect=0)
    assert again["status"] == "switched" and again["from"]["profile"] == "cpu-ar"
    assert any(s.startswith("undid the interrupted `ddops switch") for s in again["steps"]), again["steps"]
    assert lab.info("lab-2")["model_path"] == "/var/lib/ddops/models/tiny-llama-other"
    assert lab.json("status", "--host", "lab-2", expect=0)["interrupted"] == []   # nothing left


def test_an_in_place_promote_killed_after_stopping_production_runs_again_as_the_same_promote(lab):
    settled_first(lab, "lab-1")
    lab.deploy("cpu-ar", "lab-1")
    lab.json("shadow", "start", lab.profile("ro-other"), "--host", "lab-1", "--yes", expect=0)
    kill_at(lab, '"stage": "gpu"', "shadow", "promote", "--yes", "--json-events")

    [left] = told(lab, "lab-1")
    assert left["what"].startswith("ddops shadow promote") and left["production"] == ["llm.service"]
    assert lab.json("shadow", "status", expect=0)["shadow"]["profile"] == lab.profile("ro-other")  # still recorded
    promoted = lab.json("shadow", "promote", "--yes", expect=0)
    assert promoted["status"] == "promoted" and "undid the interrupted" in promoted["detail"]
    assert read_header(lab.unit("lab-1"))["profile"] == "ro-other"
    assert lab.info("lab-1")["model_path"] == "/var/lib/ddops/models/tiny-llama-other"
    assert lab.unit("lab-1", SHADOW_UNIT) is None and lab.json("shadow", "status", expect=0)["shadow"] is None


def test_a_shadow_start_killed_after_its_gate_is_told_and_finished_by_its_rerun(lab):
    """Killed as its gate's last check passes: the shadow runs, and the record written before
    the first host change says its start is unfinished; status names it and the command that
    finishes it, a comparison is refused, and the rerun finishes it."""
    settled_first(lab, "lab-1")
    lab.deploy("cpu-ar", "lab-1")
    pid = lab.main_pid("lab-1")
    start = ("shadow", "start", lab.profile("ro-other"), "--host", "lab-1", "--yes")
    kill_at(lab, '"message": "smoke: ok"', *start, "--json-events")

    # the deploy's own record may not be written yet (then its pending.json is told beside it)
    [left] = [f for f in told(lab, "lab-1") if f["stage"] == "shadow start"]
    assert left["what"] == f"ddops shadow start {lab.profile('ro-other')} --host lab-1" and left["shadow"] == "llm-shadow.service"
    assert left["next"].startswith(left["what"]) and "ddops shadow abort" in left["next"]
    assert lab.json("shadow", "status", expect=0)["shadow"]["starting_by"]["command"] == left["what"]
    assert "has not finished" in lab.json("shadow", "compare", "--count", "1", expect=2)["error"]
    assert "has not finished" in lab.json("shadow", "promote", "--yes", expect=2)["error"]

    again = lab.json(*start, expect=0)
    assert again["status"] == "started" and again["shadow"]["starting_by"] is None
    assert lab.info("lab-1", port=30001)["model_path"] == "/var/lib/ddops/models/tiny-llama-other"
    assert lab.json("status", "--host", "lab-1", expect=0)["interrupted"] == []
    assert lab.main_pid("lab-1") == pid                                   # production never restarted
    lab.json("shadow", "abort", "--yes", expect=0)


def test_a_shadow_start_killed_in_its_gate_is_removed_whole_by_abort(lab):
    """Killed while its gate waits for health: the shadow's deploy is unfinished on the host.
    Abort removes the unit and that unfinished deploy with it; nothing is left to recover."""
    settled_first(lab, "lab-1")
    lab.deploy("cpu-ar", "lab-1")
    kill_at(lab, '"message": "health: running"', "shadow", "start", lab.profile("ro-other"), "--host", "lab-1",
            "--yes", "--json-events")
    left = told(lab, "lab-1")
    assert {f["stage"] for f in left} >= {"shadow start"}, left
    aborted = lab.json("shadow", "abort", "--yes", expect=0)
    assert aborted["status"] == "aborted"
    assert lab.unit("lab-1", SHADOW_UNIT) is None and lab.json("shadow", "status", expect=0)["shadow"] is None
    assert lab.json("status", "--host", "lab-1", expect=0)["interrupted"] == []
    with lab.remote("lab-1") as remote:
        assert remote.read_text("/var/lib/ddops/deploy/llm-shadow.service/pending.json") is None


def test_a_killed_rollback_reruns_to_the_same_entry_and_a_second_rollback_does_not_undo_it(lab):
    """rb.service is a unit of its own, so its history is this test's alone."""
    for name, base in (("rb-a", "cpu-ar"), ("rb-b", "ro-other")):
        write(lab.root / "profiles", name, f"""\
            extends: {base}
            service: {{unit: rb.service, port: 30010}}
            """)
    try:
        first = lab.deploy("rb-a", "lab-3")["history_entry"]
        lab.deploy("rb-b", "lab-3")
        shown = lab.json("rollback", "--host", "lab-3", "--unit", "rb.service", "--dry-run", expect=0)
        assert shown["rolled_back_to"] == first and "restart" in [s["action"] for s in shown["plan"]["steps"]]
        kill_at(lab, "restart", "rollback", "--host", "lab-3", "--unit", "rb.service", "--yes")
        again = lab.json("rollback", "--host", "lab-3", "--unit", "rb.service", "--yes", expect=0)
        assert again["rolled_back_to"] == first and again["result"] == "deployed", again
        assert any("recovered an unfinished deploy" in n for n in again["notes"]), again["notes"]
        assert read_header(lab.unit("lab-3", RB_UNIT))["profile"] == "rb-a"

        second = lab.json("rollback", "--host", "lab-3", "--unit", "rb.service", "--yes", expect=2)
        assert "no earlier passed deploy" in second["error"]
        assert read_header(lab.unit("lab-3", RB_UNIT))["profile"] == "rb-a"   # not undone
    finally:
        with lab.remote("lab-3") as remote:
            remote.run("systemctl disable --now rb.service; rm -rf /etc/systemd/system/rb.service "
                       "/etc/ddops/rb.env /var/lib/ddops/history/rb.service /var/lib/ddops/deploy/rb.service; "
                       "systemctl daemon-reload", check=False)


def test_a_rollout_killed_in_its_canary_and_resumed_still_reverts_the_canary(lab, tmp_path):
    """Killed while the canary's deploy is on the host (its pending.json says pushing), resumed
    with the second host refused: the halt reverts the canary to what it ran before the rollout,
    the entry its recovery restores, rather than needing an operator."""
    hosts = ["lab-1", "lab-2"]
    base = tmp_path / "base.yaml"
    base.write_text(yaml.safe_dump({"profile": "cpu-ar", "hosts": hosts, "wave_size": 2}))
    assert lab.ddops("rollout", str(base), "--yes", "--json").returncode == 0
    plan = tmp_path / "ddtree.yaml"
    plan.write_text(yaml.safe_dump({"profile": lab.profile("ro-ddtree"), "hosts": hosts, "canary": 1,
                                    "wave_size": 1, "max_failures": 0}))
    from tests.fixtures_lab import REPO
    first = subprocess.Popen([sys.executable, "-m", "ddops", "rollout", str(plan), "--yes", "--json"], cwd=REPO,
                             env={**os.environ, **lab.env}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        with lab.remote("lab-1") as remote:
            deadline = time.monotonic() + 120
            while '"pushing"' not in (remote.read_text(PENDING) or "") and time.monotonic() < deadline:
                time.sleep(0.2)
        first.send_signal(signal.SIGKILL)
    finally:
        first.wait(timeout=60)
    rolling = [f for f in told(lab, "lab-1") if f["stage"].startswith("rollout")]
    assert [f["next"] for f in rolling] == [f"ddops rollout {plan} (resumes it)"], rolling
    with lab.remote("lab-2") as remote:   # the second host loses the candidate's draft
        remote.run(f"mv {DRAFT} {DRAFT}.hidden")
    try:
        doc = lab.json("rollout", str(plan), "--yes", expect=1)
    finally:
        with lab.remote("lab-2") as remote:
            remote.run(f"mv {DRAFT}.hidden {DRAFT}")
    assert doc["resumed"] is True and doc["status"] == "halted"
    assert lab.json("status", "--host", "lab-1", expect=0)["interrupted"] == []      # ended: nothing told
    assert {h: s["status"] for h, s in doc["hosts"].items()} == {"lab-1": "reverted", "lab-2": "refused"}
    for host in hosts:
        assert read_header(lab.unit(host))["profile"] == "cpu-ar"
        assert lab.info(host)["speculative_algorithm"] in (None, "NONE", "")


def test_dry_runs_of_shadow_and_rollout_show_their_steps_and_change_nothing(lab, tmp_path):
    lab.deploy("cpu-ar", "lab-1")
    unit, pid = lab.unit("lab-1"), lab.main_pid("lab-1")
    start = lab.json("shadow", "start", lab.profile("ro-other"), "--host", "lab-1", "--dry-run", expect=0)
    assert [s["action"] for s in start["steps"]][:3] == ["record-start", "deploy backup", "deploy write-unit"]
    assert start["steps"][-1]["action"] == "record" and lab.unit("lab-1", SHADOW_UNIT) is None
    assert lab.json("shadow", "status", expect=0)["shadow"] is None

    lab.json("shadow", "start", lab.profile("ro-other"), "--host", "lab-1", "--yes", expect=0)
    promote = lab.json("shadow", "promote", "--dry-run", expect=0)
    assert [s["action"] for s in promote["steps"]][:4] == ["remove", "snapshot", "record-change", "stop"]
    abort = lab.json("shadow", "abort", "--dry-run", expect=0)
    assert [s["action"] for s in abort["steps"]] == ["remove", "forget"]
    assert lab.unit("lab-1", SHADOW_UNIT) is not None and lab.json("shadow", "status", expect=0)["shadow"]
    lab.json("shadow", "abort", "--yes", expect=0)

    plan = tmp_path / "other.yaml"
    plan.write_text(yaml.safe_dump({"profile": lab.profile("ro-missing"), "hosts": ["lab-1"]}))
    rollout = lab.json("rollout", str(plan), "--dry-run", expect=2)     # planning refuses: no model there
    assert rollout["hosts"]["lab-1"]["refusals"][0]["check"] == "model-missing"
    assert lab.unit("lab-1") == unit and lab.main_pid("lab-1") == pid    # production never restarted


def test_a_switch_whose_host_freezes_after_it_stopped_production_ends_serving_the_new_profile(lab, monkeypatch):
    """Every process of the host frozen 25 s (the cgroup freezer: sshd and the service stand still,
    the kernel still acknowledges) once the switch has stopped production and waits for the GPU
    to be free: it rides the freeze out, or says the host needs a look and its rerun settles it."""
    from ddops.lab.faults import frozen
    settled_first(lab, "lab-2")
    lab.deploy("cpu-ar", "lab-2")
    host = slot(lab, "lab-2", monkeypatch)
    args = ("switch", lab.profile("ro-other"), "--host", "lab-2")
    code, said = faulted_at(lab, '"stage": "gpu"', lambda: frozen(host.netns, 25), *args, "--yes", "--json-events")
    converges(lab, code, "lab-2", args, said)
    assert lab.info("lab-2")["model_path"] == "/var/lib/ddops/models/tiny-llama-other", said


def test_a_switch_whose_host_freezes_as_its_gate_begins_rides_it_out(lab, monkeypatch):
    """The host frozen 20 s as the switch's gate starts on the new unit: its unit watch hears
    nothing for longer than a poll, and rides that out with the last state it saw while the
    gate's probes wait, so the switch ends done (exit 0), not 'connection lost' with the host
    half changed (exit 3, which a watch that gave up after 10 s made of it)."""
    from ddops.lab.faults import frozen
    settled_first(lab, "lab-2")
    lab.deploy("cpu-ar", "lab-2")
    host = slot(lab, "lab-2", monkeypatch)
    args = ("switch", lab.profile("ro-other"), "--host", "lab-2")
    code, said = faulted_at(lab, '"stage": "health"', lambda: frozen(host.netns, 20), *args, "--yes", "--json-events")
    assert code == 0, said
    assert lab.json("status", "--host", "lab-2", expect=0)["interrupted"] == []
    assert lab.info("lab-2")["model_path"] == "/var/lib/ddops/models/tiny-llama-other", said


def test_a_rollout_whose_canary_loses_its_link_mid_deploy_ends_with_both_hosts_changed(lab, tmp_path, monkeypatch):
    """The canary's link on the lab bridge down 25 s (packets lost, nothing reset) as its deploy
    runs, so its SSH steps and gate run into it: the rollout rides it out, or says the host needs a look and its rerun settles it;
    either way it ends with both hosts on the new profile and nothing left."""
    from ddops.lab.faults import link_cut
    for host in ("lab-1", "lab-2"):
        settled_first(lab, host)
    if lab.json("shadow", "status", expect=0)["shadow"]:
        lab.json("shadow", "abort", "--yes", expect=0)
    base = tmp_path / "base.yaml"
    base.write_text(yaml.safe_dump({"profile": "cpu-ar", "hosts": ["lab-1", "lab-2"], "wave_size": 2}))
    assert lab.ddops("rollout", str(base), "--yes", "--json").returncode == 0
    plan = tmp_path / "other.yaml"
    plan.write_text(yaml.safe_dump({"profile": lab.profile("ro-other"), "hosts": ["lab-1", "lab-2"], "canary": 1,
                                    "wave_size": 1, "max_failures": 0}))
    veth = slot(lab, "lab-1", monkeypatch).veth
    # 2 s after the wave starts: its connection is open (a cut before it gives exit 6, nothing changed)
    code, said = faulted_at(lab, '"event": "wave"', lambda: (time.sleep(2), link_cut(veth, 25)),
                            "rollout", str(plan), "--yes", "--json-events")
    converges(lab, code, "lab-1", ("rollout", str(plan)), said)
    for host in ("lab-1", "lab-2"):
        assert read_header(lab.unit(host))["profile"] == "ro-other", said
        assert lab.info(host)["model_path"] == "/var/lib/ddops/models/tiny-llama-other"
