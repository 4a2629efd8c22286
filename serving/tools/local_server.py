"""A `python -m serving` child process on a free loopback port: the one way the fuzz and abuse
commands and the test suites start the runtime they talk to over HTTP.

Imports neither torch nor the runtime (the ops-side test suites use it too). Without a model
path, `LocalServer` serves a tiny random checkpoint written to a temporary directory
(serving.tools.tiny), so the commands need no download.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    """`python -m serving --model-path MODEL ...flags` on 127.0.0.1, its output in `log`.

    `env` replaces the inherited environment (default: this process's); torch gets `threads`
    threads either way. `wait_ready` polls /health; `stop` terminates, then kills after 20 s."""

    def __init__(self, model: Path, log: Path, *flags: str, env: dict | None = None, threads: int = 1):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        cmd = [sys.executable, "-m", "serving", "--model-path", str(model), "--host", "127.0.0.1",
               "--port", str(self.port), "--device", "cpu", *flags]
        env = {**(os.environ if env is None else env), "OMP_NUM_THREADS": str(threads),
               "MKL_NUM_THREADS": str(threads)}
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
        raise RuntimeError(f"server not ready after {timeout_s:.0f} s: {self.log.read_text()[-2000:]}")

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


class LocalServer:
    """Context manager: start, wait for /health, yield self (url, port), stop on exit."""

    def __init__(self, model_path: Path | None, flags: list[str], threads: int = 1):
        self.model_path, self.flags, self.threads = model_path, flags, threads
        self.tmp = tempfile.TemporaryDirectory(prefix="ddops-local-")
        self.server: ServerProcess | None = None

    def __enter__(self) -> "LocalServer":
        model = self.model_path
        if model is None:
            from serving.tools.tiny import write_tiny
            model = write_tiny(Path(self.tmp.name) / "tiny", arch="llama")
        self.server = ServerProcess(model, Path(self.tmp.name) / "server.log", "--log-level", "warning",
                                    *self.flags, threads=self.threads)
        try:
            self.server.wait_ready(timeout_s=180.0)
        except BaseException:
            self.__exit__()
            raise
        self.url, self.port = self.server.url, self.server.port
        return self

    def __exit__(self, *exc) -> None:
        if self.server is not None:
            self.server.stop()
        self.tmp.cleanup()
