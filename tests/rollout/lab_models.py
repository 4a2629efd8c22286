"""Models the rollout lab tests push to lab hosts, built once into $DDOPS_CACHE/models.

tiny-llama (seed 0) with a distilled DFlash draft (so speculation really accepts: the gate
requires an accepted length above 1), and tiny-llama-other (seed 1): a different model for
the wrong-shadow test. All deterministic and re-creatable by these commands.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def _tool(*args: str) -> None:
    subprocess.run([sys.executable, "-m", *args], check=True, env=ENV, capture_output=True, timeout=900)


def build(cache: Path) -> dict[str, Path]:
    models = cache / "models"
    paths = {"tiny-llama": models / "tiny-llama", "tiny-llama-dflash": models / "tiny-llama-dflash",
             "tiny-llama-other": models / "tiny-llama-other"}
    if not (paths["tiny-llama"] / "model.safetensors").is_file():
        _tool("serving.tools.tiny", "--out", str(paths["tiny-llama"]), "--seed", "0")
    if not (paths["tiny-llama-dflash"] / "model.safetensors").is_file():
        _tool("serving.tools.tiny_draft", "--target", str(paths["tiny-llama"]),
              "--out", str(paths["tiny-llama-dflash"]), "--distill")
    if not (paths["tiny-llama-other"] / "model.safetensors").is_file():
        _tool("serving.tools.tiny", "--out", str(paths["tiny-llama-other"]), "--seed", "1")
    return paths
