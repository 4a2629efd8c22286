"""Fixtures for the runtime tests: tiny checkpoints, loaded models, a real server process."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from serving.models import inspect_checkpoint, load_model
from serving.models.tokenizer import Tokenizer
from serving.tools.tiny import write_tiny
from tests.server_process import ServerProcess

torch.set_num_threads(1)
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
    """The runtime serving the tiny Llama as `tiny`, with an API key, context 256; /health_generate
    probes back to back (interval 0), so the fuzz run's probe calls do not wait."""
    log = tmp_path_factory.mktemp("http") / "server.log"
    proc = ServerProcess(tiny_llama, log, "--api-key", KEY, "--served-model-name", "tiny",
                         "--max-request-bytes", str(BODY_LIMIT), "--context-length", "256",
                         "--health-generate-interval", "0")
    yield proc.wait_ready()
    proc.stop()


