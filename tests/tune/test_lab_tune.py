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
    lab.deploy("cpu-ar", "lab-1")
    return lab


class Clients:
    """Production's own clients: one request after another until stopped; errors counted."""

    def __init__(self, lab):
        self.url = f"http://{lab.lab.host('lab-1').address}:30000/v1/completions"
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


def production_process(lab) -> tuple[str, ...]:
    with lab.remote("lab-1") as remote:
        return tuple(remote.run("systemctl show llm.service -p ExecMainPID -p NRestarts "
                                "-p ActiveEnterTimestampMonotonic --value").stdout.split())


def leftovers(lab) -> dict:
    with lab.remote("lab-1") as remote:
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


def test_a_killed_tuner_leaves_nothing_running_and_a_rerun_resumes(tuning, tmp_path):
    lab = tuning
    space = tmp_path / "space.yaml"
    space.write_text(yaml.safe_dump({"speculative.algorithm": ["ddtree"], "speculative.block_size": [4],
                                     "speculative.ddtree_budget": [4, 8],
                                     "speculative.adaptive": [False], "memory.max_running_requests": [4]}))
    args = ("tune", lab.profile("tn-ddtree"), "--host", "lab-1", "--space", str(space), "--count", "2",
            "--max-tokens", "8", "--concurrency", "1", "--out", str(tmp_path / "tuned.yaml"), "--yes")
    from tests.fixtures_lab import REPO
    proc = subprocess.Popen([sys.executable, "-m", "ddops", *args, "--json-events"], cwd=REPO, text=True,
                            env={**os.environ, **lab.env}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    starts, seen = 0, []
    for line in proc.stdout:
        seen.append(line)
        starts += "start as llm-tune.service" in line
        if starts == 2 and "health: waiting" in line:    # the second candidate runs: the first was measured
            proc.send_signal(signal.SIGKILL)
            break
    proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL, "".join(seen)
    killed = time.monotonic()
    assert leftovers(lab)["active"] in ("active", "activating")
    # `ddops status` names the tuning left behind, its candidate, and the command that ends it
    from tests.rollout.test_lab_faults import told
    tuning_left = [item for item in told(lab, "lab-1") if item["stage"] == "tuning"]
    assert tuning_left and tuning_left[0]["candidates"] == ["llm-tune.service"]
    assert tuning_left[0]["next"] == "ddops recover --host lab-1"
    # nothing asks the host: the candidate ends with its lease (EXPIRES_S 90 + the lease's 5 s poll)
    while (left := leftovers(lab))["active"] != "inactive" or left["lease"] != "inactive":
        assert time.monotonic() - killed < 120, left
        time.sleep(3)
    # the next command that takes the host's lock removes the candidate's files and says so
    recovered = lab.ddops("recover", "--host", "lab-1", "--yes", "--json")
    assert recovered.returncode == 0, recovered.stdout + recovered.stderr
    assert "ended the tuning left by" in recovered.stdout
    assert leftovers(lab) == NOTHING_LEFT
    # the rerun resumes the study: the first candidate is not measured again
    rerun = lab.json(*args, expect=0)
    assert rerun["measured_before"] == 1 and rerun["started"] == 1
    assert [r["status"] for r in rerun["rows"]].count("skipped") == 0 and rerun["chosen"]
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
