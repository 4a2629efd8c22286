"""Real `python -m serving` processes on loopback ports for the comparison tests."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.server_process import THREADS, ServerProcess


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


def Server(model: Path, log: Path, *flags: str, api_key: str | None = None) -> ServerProcess:
    """A runtime process serving `model` as `tiny` (the name the comparison requests)."""
    return ServerProcess(model, log, "--served-model-name", "tiny", *flags, api_key=api_key)
