"""Test models for deploy: the deliberately mismatched draft, re-creatable in $DDOPS_CACHE.

The draft is a real DFlash draft (serving.tools.tiny_draft) built for a target of hidden size
96; paired with the tiny target (hidden 64) its fc input width does not fit."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

WIDE_HIDDEN = 96


def wide_draft(cache: Path) -> Path:
    out = cache / "models" / "tiny-wide-dflash"
    if (out / "model.safetensors").is_file():
        return out
    with tempfile.TemporaryDirectory() as tmp:
        target = Path(tmp) / "wide-target"
        target.mkdir()
        config = {"hidden_size": WIDE_HIDDEN, "num_hidden_layers": 4, "num_attention_heads": 4,
                  "num_key_value_heads": 2, "head_dim": 24, "vocab_size": 512,
                  "max_position_embeddings": 1024, "rms_norm_eps": 1e-6, "rope_theta": 10000.0}
        (target / "config.json").write_text(json.dumps(config))
        subprocess.run([sys.executable, "-m", "serving.tools.tiny_draft", "--target", str(target),
                        "--out", str(out)], check=True, capture_output=True)
    return out


def tiny_pair(cache: Path) -> tuple[Path, Path]:
    """The tiny target and its distilled DFlash draft (real acceptance), made once per cache."""
    models = cache / "models"
    target, draft = models / "tiny-llama", models / "tiny-llama-dflash"
    if not (target / "config.json").is_file():
        subprocess.run([sys.executable, "-m", "serving.tools.tiny", "--out", str(target)],
                       check=True, capture_output=True)
    if not (draft / "model.safetensors").is_file():
        subprocess.run([sys.executable, "-m", "serving.tools.tiny_draft", "--target", str(target),
                        "--out", str(draft), "--distill"], check=True, capture_output=True)
    return target, draft
