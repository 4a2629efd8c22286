"""Real `python -m serving` processes on loopback ports for the comparison tests."""

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


def make_checkpoints(root: Path) -> dict[str, Path]:
    """Target (seed 0), a different model (seed 1), and a DFlash draft shaped to the target."""
    paths = {"target": root / "target", "other": root / "other", "draft": root / "draft"}
    tool = [sys.executable, "-m"]
    env = {**os.environ, **THREADS}
    if not (paths["target"] / "config.json").exists():
        subprocess.run(tool + ["serving.tools.tiny", "--out", str(paths["target"]), "--seed", "0"],
                       check=True, env=env, capture_output=True)
    if not (paths["other"] / "config.json").exists():
        subprocess.run(tool + ["serving.tools.tiny", "--out", str(paths["other"]), "--seed", "1"],
                       check=True, env=env, capture_output=True)
    if not (paths["draft"] / "config.json").exists():
        subprocess.run(tool + ["serving.tools.tiny_draft", "--target", str(paths["target"]),
                               "--out", str(paths["draft"])], check=True, env=env, capture_output=True)
    return paths


class Server:
    """One runtime process; stopped (and waited for) by `stop`."""

    def __init__(self, model: Path, log: Path, *extra: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        command = [sys.executable, "-m", "serving", "--model-path", str(model), "--host", "127.0.0.1",
                   "--port", str(self.port), "--device", "cpu", "--served-model-name", "tiny", *extra]
        self.process = subprocess.Popen(command, stdout=log.open("wb"), stderr=subprocess.STDOUT,
                                        env={**os.environ, **THREADS})

    def wait_ready(self, timeout_s: float = 120) -> "Server":
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"server exited {self.process.returncode}: {self.log.read_text()[-2000:]}")
            try:
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"server not ready in {timeout_s} s: {self.log.read_text()[-2000:]}")

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
