"""A `python -m serving` child process on a free loopback port, for the fuzz and abuse commands.

Without a model path it serves a tiny random checkpoint written to a temporary directory
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


class LocalServer:
    """Context manager: start, wait for /health, yield self (url, port), terminate on exit."""

    def __init__(self, model_path: Path | None, flags: list[str], threads: int = 1):
        self.model_path, self.flags, self.threads = model_path, flags, threads
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.tmp = tempfile.TemporaryDirectory(prefix="ddops-local-")
        self.process: subprocess.Popen | None = None

    def __enter__(self) -> "LocalServer":
        model = self.model_path
        if model is None:
            from serving.tools.tiny import write_tiny
            model = write_tiny(Path(self.tmp.name) / "tiny", arch="llama")
        log = Path(self.tmp.name) / "server.log"
        env = {**os.environ, "OMP_NUM_THREADS": str(self.threads), "MKL_NUM_THREADS": str(self.threads)}
        cmd = [sys.executable, "-m", "serving", "--model-path", str(model), "--host", "127.0.0.1",
               "--port", str(self.port), "--device", "cpu", "--log-level", "warning", *self.flags]
        self.process = subprocess.Popen(cmd, stdout=log.open("wb"), stderr=subprocess.STDOUT, env=env)
        self._wait_ready(log)
        return self

    def _wait_ready(self, log: Path, timeout_s: float = 180.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"server exited {self.process.returncode}: {log.read_text()[-2000:]}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"server not ready after {timeout_s:.0f} s: {log.read_text()[-2000:]}")

    def __exit__(self, *exc) -> None:
        if self.process is not None:
            self.process.terminate()
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.tmp.cleanup()
