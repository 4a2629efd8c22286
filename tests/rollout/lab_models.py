"""Models the rollout lab tests push to lab hosts, built into $DDOPS_CACHE/models/rollout-<key>.

tiny-llama (seed 0) with a distilled DFlash draft (real acceptance: the gate requires an
accepted length above 1), and tiny-llama-other (seed 1): a different model for the
wrong-shadow test. The key is a digest of the runtime's model tools, so a change to how they
build models rebuilds these instead of reusing stale files. Pushed under the names the cpu-*
profiles use (/var/lib/ddops/models/<name>).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TOOLS = ("serving/tools/tiny.py", "serving/tools/draft_files.py", "serving/tools/tiny_draft.py",
         "serving/tools/train_draft.py", "serving/models/cpu_gemm.py")   # the head is in the training graph
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
NAMES = ("tiny-llama", "tiny-llama-dflash", "tiny-llama-other")


def tools_key() -> str:
    digest = hashlib.sha256()
    for tool in TOOLS:
        path = REPO / tool
        digest.update(path.read_bytes() if path.is_file() else b"-")
    return digest.hexdigest()[:12]


def _tool(*args: str) -> None:
    subprocess.run([sys.executable, "-m", *args], check=True, env=ENV, capture_output=True, timeout=900)


def build(cache: Path) -> dict[str, Path]:
    root = cache / "models" / f"rollout-{tools_key()}"
    if not all((root / name / "model.safetensors").is_file() for name in NAMES):
        tmp = root.with_name(root.name + f".tmp{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        _tool("serving.tools.tiny", "--out", str(tmp / "tiny-llama"), "--seed", "0")
        _tool("serving.tools.tiny_draft", "--target", str(tmp / "tiny-llama"),
              "--out", str(tmp / "tiny-llama-dflash"), "--distill")
        _tool("serving.tools.tiny", "--out", str(tmp / "tiny-llama-other"), "--seed", "1")
        shutil.rmtree(root, ignore_errors=True)
        tmp.rename(root)  # atomic: a half-built set is never picked up
        for stale in root.parent.glob("rollout-*"):  # sets built by older tools
            if stale != root and ".tmp" not in stale.name:
                shutil.rmtree(stale, ignore_errors=True)
    return {name: root / name for name in NAMES}
