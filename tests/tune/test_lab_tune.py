"""`ddops tune` on a real lab host: candidates of the tiny DDTree profile run beside plain
production as llm-tune.service, gated, measured and removed, while a client keeps asking
production; candidates planning refuses are never started; a tuner killed mid-candidate leaves
nothing running once its lease runs out, the next locked command removes what it left, and a
rerun resumes the study."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import httpx
import pytest
import yaml

from ddops.profile import load_profile
from tests.conftest import TEST_API_KEY
from tests.rollout.test_lab_rollout import lab, write  # noqa: F401 (the module's lab fixture)

pytestmark = pytest.mark.lab
TUNE_UNIT = "/etc/systemd/system/llm-tune.service"


@pytest.fixture(scope="module")
def tuning(lab):
    write(lab.root / "profiles", "tn-ddtree", """\
        extends: cpu-ddtree
        smoke:
          messages: [{role: user, content: Write a Python function that prints FizzBuzz for the numbers 1 to 20.}]
        """)
    write(lab.root / "profiles", "tn-ar-mirror", """\
        extends: cpu-ar
        service: {mirror: true}
        """)
    lab.deploy("cpu-ar", "lab-1")
    return lab


class Clients:
    """Production's own clients: one request after another until stopped; errors counted."""

    def __init__(self, lab, host: str = "lab-1"):
        self.url = f"http://{lab.lab.host(host).address}:30000/v1/completions"
        self.done, self.errors, self.stop = 0, [], threading.Event()
        self.thread = threading.Thread(target=self.loop, daemon=True)

    def loop(self):
        headers = {"Authorization": f"Bearer {TEST_API_KEY}"}
        with httpx.Client(timeout=60, trust_env=False) as client:
            while not self.stop.is_set():
                try:
                    r = client.post(self.url, headers=headers, json={"model": "tiny-llama", "prompt": "1, 2, 3,",
                                                                     "max_tokens": 8, "temperature": 0})
                    self.done += 1
                    if r.status_code != 200:
                        self.errors.append(f"HTTP {r.status_code}")
                except httpx.HTTPError as err:
                    self.errors.append(repr(err))
                time.sleep(0.2)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join(timeout=90)


def production_process(lab, host: str = "lab-1") -> tuple[str, ...]:
    with lab.remote(host) as remote:
        return tuple(remote.run("systemctl show llm.service -p ExecMainPID -p NRestarts "
                                "-p ActiveEnterTimestampMonotonic --value").stdout.split())


def leftovers(lab, host: str = "lab-1") -> dict:
    with lab.remote(host) as remote:
        return {"unit_file": remote.read_text(TUNE_UNIT) is not None,
                "active": remote.run("systemctl is-active llm-tune.service", check=False).stdout.strip(),
                "lease": remote.run("systemctl is-active ddops-tune-lease.service", check=False).stdout.strip(),
                "lease_file": remote.read_text("/run/ddops/tune-lease.json") is not None}


NOTHING_LEFT = {"unit_file": False, "active": "inactive", "lease": "inactive", "lease_file": False}


def test_tune_measures_candidates_beside_serving_production_and_writes_the_winner(tuning, tmp_path):
    lab = tuning
    space = tmp_path / "space.yaml"
    space.write_text(yaml.safe_dump({"speculative.algorithm": ["none", "ddtree"], "speculative.block_size": [4, 16],
                                     "speculative.ddtree_budget": [4, 16], "speculative.adaptive": [False],
                                     "memory.max_running_requests": [4]}))
    tuned = tmp_path / "tn-ddtree-tuned.yaml"
    before = production_process(lab)
    with Clients(lab) as clients:
        doc = lab.json("tune", lab.profile("tn-ddtree"), "--host", "lab-1", "--space", str(space), "--count", "4",
                       "--max-tokens", "16", "--concurrency", "1,2", "--out", str(tuned), "--yes", expect=0)
    # production kept serving, untouched: same process, no restart, every client answered
    assert production_process(lab) == before
    assert clients.done > 10 and clients.errors == []
    rows = {r["label"]: r for r in doc["rows"]}
    # a block wider than the draft was trained for is refused by the planning checks: never started
    skipped = [r for r in doc["rows"] if r["status"] == "skipped"]
    assert len(skipped) == 2 and all("block_size=16" in r["label"] and "trained block_size 8" in r["reason"]
                                     for r in skipped)
    measured = [r for r in doc["rows"] if r["status"] in ("measured", "chosen", "pruned", "unmet")]
    assert len(measured) == 3 and doc["tune"]["search"] == "grid"
    for r in measured:
        if r["status"] != "pruned":
            assert [lv["concurrency"] for lv in r["levels"]] == [1, 2]
            assert all(lv["errors"] == 0 and lv["token_equality"] == 1.0 for lv in r["levels"])
    speculative = [r for r in measured if "algorithm=ddtree" in r["label"] and r["accept_length"]]
    assert speculative and all(r["accept_length"] > 1.0 for r in speculative)   # speculation really ran
    chosen = doc["chosen"]
    assert rows[chosen["label"]]["status"] == "chosen"
    assert chosen["objective"] == max(r["objective"] or 0 for r in doc["rows"] if r["status"] in ("measured", "chosen"))
    # the tuned profile extends the base with only the winning values, and loads
    text = tuned.read_text()
    assert "extends: ../rollout-lab0/profiles/tn-ddtree.yaml" in text or "tn-ddtree.yaml" in text
    assert "x production" in text
    profile = load_profile(str(tuned))
    for key, value in chosen["overrides"].items():
        section, name = key.split(".")
        assert getattr(getattr(profile, section), name) == value
    page = open(doc["report_file"]).read()
    assert chosen["label"] in page and "trained block_size 8" in page
    assert leftovers(lab) == NOTHING_LEFT


def test_a_tuner_on_a_spare_host_killed_leaves_nothing_running_and_a_rerun_resumes(tuning, tmp_path):
    """Candidates on a spare host (`--on lab-2`), production on lab-1 the yardstick: killed in its
    second candidate, the spare is told and emptied; the rerun measures only what is left, in
    about the time its plan said, calibrated by the first run's candidate."""
    lab = tuning
    space = tmp_path / "space.yaml"
    space.write_text(yaml.safe_dump({"speculative.algorithm": ["ddtree"], "speculative.block_size": [4],
                                     "speculative.ddtree_budget": [4, 8],
                                     "speculative.adaptive": [False], "memory.max_running_requests": [4]}))
    args = ("tune", lab.profile("tn-ddtree"), "--host", "lab-1", "--on", "lab-2", "--space", str(space),
            "--count", "2", "--max-tokens", "8", "--concurrency", "1", "--out", str(tmp_path / "tuned.yaml"), "--yes")
    before = production_process(lab)
    from tests.fixtures_lab import REPO
    proc = subprocess.Popen([sys.executable, "-m", "ddops", *args, "--json-events"], cwd=REPO, text=True,
                            env={**os.environ, **lab.env}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    starts, seen = 0, []
    for line in proc.stdout:
        seen.append(line)
        starts += "start as llm-tune.service on lab-2" in line
        if starts == 2 and "health: waiting" in line:    # the second candidate runs: the first was measured
            proc.send_signal(signal.SIGKILL)
            break
    proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL, "".join(seen)
    killed = time.monotonic()
    assert leftovers(lab, "lab-2")["active"] in ("active", "activating")
    assert leftovers(lab, "lab-1") == NOTHING_LEFT        # production's host runs no candidate
    # `ddops status` names the tuning left behind, its candidate, and the command that ends it
    from tests.rollout.test_lab_faults import told
    tuning_left = [item for item in told(lab, "lab-2") if item["stage"] == "tuning"]
    assert tuning_left and tuning_left[0]["candidates"] == ["llm-tune.service"]
    assert tuning_left[0]["next"] == "ddops recover --host lab-2"
    # nothing asks the host: the candidate ends with its lease (EXPIRES_S 90 + the lease's 5 s poll)
    while (left := leftovers(lab, "lab-2"))["active"] != "inactive" or left["lease"] != "inactive":
        assert time.monotonic() - killed < 120, left
        time.sleep(3)
    # the next command that takes the host's lock removes the candidate's files and says so
    recovered = lab.ddops("recover", "--host", "lab-2", "--yes", "--json")
    assert recovered.returncode == 0, recovered.stdout + recovered.stderr
    assert "ended the tuning left by" in recovered.stdout
    assert leftovers(lab, "lab-2") == NOTHING_LEFT
    # the rerun's plan says what is left and how long it takes, from the first run's candidate
    plan = lab.json(*args, "--dry-run", expect=0)
    assert plan["measured_before"] == 1 and plan["runs_on"] == "lab-2"
    assert plan["estimate_basis"].startswith("measured: 1 bundled candidate(s) started on lab-2")
    # the rerun resumes the study: the first candidate is not measured again
    rerun = lab.json(*args, expect=0)
    assert rerun["measured_before"] == 1 and rerun["started"] == 1
    assert [r["status"] for r in rerun["rows"]].count("skipped") == 0 and rerun["chosen"]
    # the time it said, against the time it took (yardstick and one candidate, on 2 shared cores)
    assert 0.5 < rerun["wall_s"] / rerun["tune"]["estimate_s"] < 2.0, (rerun["wall_s"], rerun["tune"])
    assert leftovers(lab, "lab-2") == NOTHING_LEFT
    assert production_process(lab) == before                # production was never touched


def test_tune_on_mirrored_traffic_measures_each_candidate_on_production_s_own_requests(tuning, tmp_path):
    """`--mirrored`: production's tap copies its clients' requests to the base profile's yardstick,
    then to each candidate in turn; each answers them as production did; the tap ends off."""
    lab = tuning
    lab.deploy("tn-ar-mirror", "lab-3")
    space = tmp_path / "space.yaml"
    space.write_text(yaml.safe_dump({"speculative.algorithm": ["ddtree"], "speculative.block_size": [4],
                                     "speculative.ddtree_budget": [4], "speculative.adaptive": [False],
                                     "memory.max_running_requests": [4]}))
    before = production_process(lab, "lab-3")
    with Clients(lab, "lab-3") as clients:
        doc = lab.json("tune", lab.profile("tn-ddtree"), "--host", "lab-3", "--mirrored", "--count", "4",
                       "--mirror-wait", "90s", "--space", str(space), "--out", str(tmp_path / "tuned.yaml"),
                       "--yes", expect=0)
    assert production_process(lab, "lab-3") == before and clients.errors == []
    assert doc["tune"]["mirrored"] is True
    yardstick, = doc["production"]                     # the base profile as it is, on the same traffic
    assert yardstick["concurrency"] == 0 and yardstick["requests"] >= 4 and yardstick["token_equality"] == 1.0
    row, = [r for r in doc["rows"] if r["status"] in ("chosen", "measured", "unmet")]
    level, = row["levels"]
    assert level["requests"] >= 4 and level["errors"] == 0 and level["token_equality"] == 1.0
    assert level["tokens_per_s"] > 0 and row["accept_length"] > 1.0    # speculation ran on production's requests
    assert row["status"] == "chosen" and abs(row["objective"] - level["tokens_per_s"] / yardstick["tokens_per_s"]) < 1e-6
    assert "mirrored from llm.service on lab-3" in (tmp_path / "tuned.yaml").read_text()
    tap = httpx.get(f"http://{lab.lab.host('lab-3').address}:30000/mirror", timeout=10, trust_env=False,
                    headers={"Authorization": f"Bearer {TEST_API_KEY}"}).json()
    assert tap["target"] is None and tap["sent"] >= 4            # copied to the last candidate, then turned off
    assert leftovers(lab, "lab-3") == NOTHING_LEFT
    # a tap a shadow holds is refused before anything starts; one a killed tuner left is taken back
    args = ("tune", lab.profile("tn-ddtree"), "--host", "lab-3", "--mirrored", "--space", str(space), "--dry-run")
    for target, code in (("http://127.0.0.1:9", 2), (f"http://{lab.lab.host('lab-3').address}:30002", 0)):
        pointed = httpx.put(f"http://{lab.lab.host('lab-3').address}:30000/mirror", json={"url": target},
                            timeout=10, trust_env=False, headers={"Authorization": f"Bearer {TEST_API_KEY}"})
        assert pointed.status_code == 200, pointed.text
        planned = lab.json(*args, expect=code)
        assert code == 0 or f"already copies to {target}" in planned["error"]
    httpx.delete(f"http://{lab.lab.host('lab-3').address}:30000/mirror", timeout=10, trust_env=False,
                 headers={"Authorization": f"Bearer {TEST_API_KEY}"})


def test_mirrored_tuning_is_refused_before_anything_starts_where_production_does_not_opt_in(tuning):
    lab = tuning
    refused = lab.json("tune", lab.profile("tn-ddtree"), "--host", "lab-1", "--mirrored", "--yes", expect=2)
    assert "does not opt in" in refused["error"] and "service.mirror: true" in refused["error"]
    both = lab.json("tune", lab.profile("tn-ddtree"), "--host", "lab-1", "--mirrored", "--concurrency", "1",
                    "--yes", expect=2)
    assert "leave out --prompts and --concurrency" in both["error"]
    assert leftovers(lab) == NOTHING_LEFT


def test_ctrl_c_mid_candidate_removes_it_before_the_tuner_exits(tuning, tmp_path):
    lab = tuning
    space = tmp_path / "space.yaml"
    space.write_text(yaml.safe_dump({"speculative.algorithm": ["ddtree"], "speculative.block_size": [4],
                                     "speculative.ddtree_budget": [4], "speculative.adaptive": [False],
                                     "memory.max_running_requests": [4]}))
    proc = lab.popen("tune", lab.profile("tn-ddtree"), "--host", "lab-1", "--space", str(space), "--count", "2",
                     "--max-tokens", "32", "--concurrency", "1,2", "--out", str(tmp_path / "tuned.yaml"), "--yes",
                     "--json-events")
    seen = []
    for line in proc.stdout:
        seen.append(line)
        if "concurrency 1:" in line:           # the candidate runs: interrupted in its second level
            proc.send_signal(signal.SIGINT)
            break
    proc.wait(timeout=120)
    assert proc.returncode != 0, "".join(seen)
    assert leftovers(lab) == NOTHING_LEFT        # at once: no lease to wait for, nothing to recover
    assert [item for item in lab.json("status", "--host", "lab-1", expect=0)["interrupted"]] == []


def test_apply_deploys_the_tuned_profile_as_production_through_the_gate(tuning, tmp_path):
    lab = tuning
    space = tmp_path / "space.yaml"
    space.write_text(yaml.safe_dump({"speculative.algorithm": ["ddtree"], "speculative.block_size": [4],
                                     "speculative.ddtree_budget": [8], "speculative.adaptive": [False],
                                     "memory.max_running_requests": [4]}))
    tuned = tmp_path / "tn-ddtree-tuned.yaml"
    doc = lab.json("tune", lab.profile("tn-ddtree"), "--host", "lab-1", "--space", str(space), "--count", "2",
                   "--max-tokens", "8", "--concurrency", "1", "--out", str(tuned), "--apply", "--yes", expect=0)
    assert doc["applied"]["result"] == "deployed" and doc["applied"]["history_entry"]
    from ddops.render import read_header
    assert read_header(lab.unit("lab-1"))["profile"] == "tn-ddtree-tuned"
    info = lab.info("lab-1")
    assert info["speculative_algorithm"] == "DDTREE"
    assert leftovers(lab) == NOTHING_LEFT
