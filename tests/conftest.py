"""Shared test set-up. Fixture plugins live beside their owners' tests."""

import os
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
CACHE = Path(os.environ.get("DDOPS_CACHE", "/var/cache/ddops"))
# The shipped cpu-* profiles require an API key from $DDOPS_API_KEY; every test (and every
# `ddops` it starts) deploys with this one unless it sets its own.
TEST_API_KEY = os.environ.setdefault("DDOPS_API_KEY", "ddops-test-key-7f3a")
# Rollout and shadow records go to a state directory of this test process's own, never the
# operator's ~/.local/state/ddops, and never one that a parallel worker writes at the same time.
os.environ.setdefault("DDOPS_STATE", tempfile.mkdtemp(prefix="ddops-test-state-"))

# `make test` runs three pytest-xdist workers (`-n 3`) on two cores. The lab files wait on real
# timers (the tune lease's 90 s, the Alertmanager's 2-minute `for:`) that a third worker fills:
# 26 min 51 s against 28 min 51 s at `-n 2`, the cores 87 % busy over the run (/proc/stat,
# 2026-12-07). Each test file runs whole in one worker, so
# a module fixture (a server, a deployed host) starts once, as in a serial run. Files that share
# a machine-wide resource form one group, run in one worker one after another: the lab hosts
# (systemd-nspawn containers, one bridge and fixed unit ports per lab) and the one vLLM a
# machine holds at a time (tests/vllm_server.py's lock: a worker waiting on it would idle).
# The lab files form two groups, each run by a worker that brings up a lab of its own
# (tests/fixtures_lab.py session_lab), so the two labs run side by side: the peer runtimes'
# files (SGLang's and vLLM's installs, 1053 s) with the tuner's, the mirror's and the watch's,
# and every other lab file. With the peers alone in the second lab, the first ran 1888 s while
# every other worker was done at 1450 s (`--durations`, timeline per worker, 2026-12-08).
LAB_FIXTURES = {"lab_hosts", "deploy_lab", "bare_lab", "ops_lab"}
VLLM_FILES = {"test_vllm_across.py", "test_vllm_draft.py", "test_prometheus_vllm.py"}
SECOND_LAB_FILES = {"test_lab_sglang.py", "test_lab_vllm.py", "test_lab_tune.py", "test_mirror_lab.py",
                    "test_lab_watch.py"}


def lab_group(name: str) -> str:
    return "lab-2" if name in SECOND_LAB_FILES else "lab"


def file_group(path: str) -> str | None:
    """The machine-wide resource a test file's tests share ("lab", "lab-2", "vllm"), or None."""
    name = Path(path).name
    if "pytest.mark.lab" in (REPO / path).read_text(errors="replace"):
        return lab_group(name)
    return "vllm" if name in VLLM_FILES else None


def item_group(item) -> str | None:
    fixtures = set(getattr(item, "fixturenames", ()))
    if item.get_closest_marker("lab") or LAB_FIXTURES & fixtures:
        return lab_group(item.path.name)
    return "vllm" if "vllm_server" in fixtures or item.path.name in VLLM_FILES else None


def pytest_collection_modifyitems(config, items):
    for item in items:
        path = item.path.relative_to(REPO).as_posix()
        if item_group(item) not in (None, file_group(path)):
            raise pytest.UsageError(f"{item.nodeid}: uses {item_group(item) or 'no shared resource'} but its "
                                    f"file reads as {file_group(path) or 'none'} (tests/conftest.py file_group)")


# The scopes that take longest, first, longest first (a timeline per worker, 2026-12-08, before
# the lab files were split as above: the lab group 1888 s, the peer runtimes' lab 1053 s, vLLM
# 336 s, the Alertmanager's real 2-minute `for:` 144 s; then the hybrid's sampling tests 157 s,
# the memory figures 131 s, the served default path 96 s, sampling 84 s). A file that holds the
# vLLM lock belongs to the vLLM group: run as an ordinary scope, Prometheus's vLLM file started
# last, at 1656 s, and ran alone for 116 s. A worker takes its next scope only when its last
# one is nearly done, so the one that started a lab group is busy for 20 minutes while another
# takes scope after scope: left to xdist's order (scopes by number of tests) another worker met
# all the long ones too (at `-n 2`: 1764 s of tests against 1546 s). Longest first (LPT) starts
# each long scope on a worker of its own and leaves the short scopes to level the workers' ends.
LONGEST_FIRST = ("lab", "lab-2", "vllm", "tests/monitor/test_alertmanager.py", "tests/hybrid/test_speculative.py",
                 "tests/fit/test_runtime_memory.py", "tests/speculative/test_server.py",
                 "tests/speculative/test_sampling.py")


def pytest_xdist_make_scheduler(config, log):
    from xdist.scheduler import LoadScopeScheduling

    class ByFileAndResource(LoadScopeScheduling):
        ordered = False

        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return file_group(path) or path

        def _assign_work_unit(self, node) -> None:
            if not self.ordered:
                for scope in reversed(LONGEST_FIRST):
                    if scope in self.workqueue:
                        self.workqueue.move_to_end(scope, last=False)
                self.ordered = True
            super()._assign_work_unit(node)

    return ByFileAndResource(config, log)


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO


@pytest.fixture(scope="session")
def cache_dir() -> Path:
    return CACHE

pytest_plugins = ["tests.fixtures_lab"]
