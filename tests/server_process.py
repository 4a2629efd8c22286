"""A real `python -m serving` process on a free loopback port, shared by every suite that
talks to the runtime over HTTP (no torch import here: the ops-side suites use it too)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

THREADS = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    """`python -m serving --model-path MODEL ...flags` on 127.0.0.1; `stop` terminates and waits.

    The runtime reads its key from $DDOPS_API_KEY when --api-key is absent; the test session sets
    that variable for the shipped profiles (tests/conftest.py), so a server gets a key through the
    environment only when the test passes `api_key`."""

    def __init__(self, model: Path, log: Path, *flags: str, api_key: str | None = None):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        cmd = [sys.executable, "-m", "serving", "--model-path", str(model), "--host", "127.0.0.1",
               "--port", str(self.port), "--device", "cpu", *flags]
        env = {k: v for k, v in os.environ.items() if k != "DDOPS_API_KEY"}
        env.update(THREADS, **({"DDOPS_API_KEY": api_key} if api_key else {}))
        self.process = subprocess.Popen(cmd, stdout=log.open("wb"), stderr=subprocess.STDOUT, env=env)

    def wait_ready(self, timeout_s: float = 120.0) -> "ServerProcess":
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"server exited {self.process.returncode}: {self.log.read_text()[-2000:]}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"server not ready after {timeout_s}s: {self.log.read_text()[-2000:]}")

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
