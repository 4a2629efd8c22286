"""A real `python -m serving` process on a free loopback port, shared by every suite that
talks to the runtime over HTTP (serving.tools.local_server: no torch import, so the ops-side
suites use it too)."""

from __future__ import annotations

import os
from pathlib import Path

from serving.tools.local_server import ServerProcess as _ServerProcess
from serving.tools.local_server import free_port

__all__ = ["ServerProcess", "THREADS", "free_port"]
THREADS = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}    # for other child processes of the tests


class ServerProcess(_ServerProcess):
    """The runtime reads its key from $DDOPS_API_KEY when --api-key is absent; the test session sets
    that variable for the shipped profiles (tests/conftest.py), so a server gets a key through the
    environment only when the test passes `api_key`."""

    def __init__(self, model: Path, log: Path, *flags: str, api_key: str | None = None):
        env = {k: v for k, v in os.environ.items() if k != "DDOPS_API_KEY"}
        super().__init__(model, log, *flags, env={**env, **({"DDOPS_API_KEY": api_key} if api_key else {})})
