"""Fixtures for the runtime tests: tiny checkpoints, loaded models, a real server process."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import torch

from serving.models import inspect_checkpoint, load_model
from serving.models.tokenizer import Tokenizer
from serving.tools.tiny import write_tiny

torch.set_num_threads(1)
THREADS = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
KEY = "test-key"
BODY_LIMIT = 65536
SMOLLM = Path(os.environ.get("DDOPS_CACHE", "/var/cache/ddops")) / "models" / "smollm2-135m-instruct"


@pytest.fixture(scope="session")
def tiny_root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("tiny")


@pytest.fixture(scope="session")
def tiny_llama(tiny_root) -> Path:
    return write_tiny(tiny_root / "llama", arch="llama")


@pytest.fixture(scope="session")
def tiny_qwen3(tiny_root) -> Path:
    return write_tiny(tiny_root / "qwen3", arch="qwen3", shards=2)


def load(path: Path, dtype=torch.float32, positions: int = 1024):
    return load_model(inspect_checkpoint(path), dtype, "cpu", positions)


@pytest.fixture(scope="session")
def llama_model(tiny_llama):
    return load(tiny_llama)


@pytest.fixture(scope="session")
def llama_tokenizer(tiny_llama):
    return Tokenizer.from_dir(tiny_llama)


@pytest.fixture(scope="session")
def smollm_dir() -> Path:
    """The converted SmolLM2 checkpoint (`make models`); converted here when missing (cached)."""
    if not (SMOLLM / "ddops-conversion.json").is_file():
        subprocess.run([sys.executable, "-m", "serving.tools.smollm2", "--out", str(SMOLLM)], check=True)
    return SMOLLM


@pytest.fixture(scope="session")
def tiny_server(tiny_llama, tmp_path_factory):
    """The runtime serving the tiny Llama as `tiny`, with an API key, context 256."""
    log = tmp_path_factory.mktemp("http") / "server.log"
    proc = ServerProcess(tiny_llama, log, "--api-key", KEY, "--served-model-name", "tiny",
                         "--max-request-bytes", str(BODY_LIMIT), "--context-length", "256")
    yield proc.wait_ready()
    proc.stop()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    """`python -m serving ...` on a free loopback port; `stop` terminates and waits."""

    def __init__(self, model: Path, log: Path, *flags: str):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        cmd = [sys.executable, "-m", "serving", "--model-path", str(model), "--port", str(self.port),
               "--device", "cpu", *flags]
        self.process = subprocess.Popen(cmd, stdout=log.open("wb"), stderr=subprocess.STDOUT,
                                        env={**os.environ, **THREADS})

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
