"""The tiny hybrid target (serving.tools.tiny --arch qwen3_5) and its distilled DFlash draft,
built once into $DDOPS_CACHE/models/hybrid-<digest of the model tools>, under the names
profiles/cpu-hybrid-ddtree.yaml uses (tests/deploy/test_lab_hybrid.py, tests/test_contract.py)."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TOOLS = ("serving/tools/tiny.py", "serving/tools/tiny_hybrid.py", "serving/tools/tiny_draft.py",
         "serving/tools/train_draft.py", "serving/models/cpu_gemm.py")   # the head is in the training graph
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def hybrid_pair(cache: Path) -> tuple[Path, Path]:
    digest = hashlib.sha256()
    for tool in TOOLS:
        digest.update((REPO / tool).read_bytes())
    root = cache / "models" / f"hybrid-{digest.hexdigest()[:12]}"
    target, draft = root / "tiny-qwen3_5", root / "tiny-qwen3_5-dflash"
    if not (draft / "model.safetensors").is_file():
        tmp = root.with_name(root.name + f".tmp{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        for step in (["serving.tools.tiny", "--arch", "qwen3_5", "--out", str(tmp / target.name)],
                     ["serving.tools.tiny_draft", "--target", str(tmp / target.name),
                      "--out", str(tmp / draft.name), "--distill"]):
            subprocess.run([sys.executable, "-m", *step], check=True, env=ENV, capture_output=True, timeout=900)
        shutil.rmtree(root, ignore_errors=True)
        tmp.rename(root)   # atomic: a half-built pair is never picked up
    return target, draft
