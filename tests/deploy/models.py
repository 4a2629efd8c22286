"""Models the deploy lab tests push to the host.

The tiny target and its distilled DFlash draft are the ones the rollout lab tests build
(tests/rollout/lab_models.py: $DDOPS_CACHE/models/rollout-<digest of the model tools>), so a
test session distills one draft, not two. The deliberately mismatched draft is a real DFlash
draft (serving.tools.tiny_draft) built for a target of hidden size 96; paired with the tiny
target (hidden 64) its fc input width does not fit. Same digest, same atomic build."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from tests.rollout.lab_models import build, tools_key

WIDE_HIDDEN = 96


def tiny_pair(cache: Path) -> tuple[Path, Path]:
    models = build(cache)
    return models["tiny-llama"], models["tiny-llama-dflash"]


def wide_draft(cache: Path) -> Path:
    out = cache / "models" / f"deploy-{tools_key()}" / "tiny-wide-dflash"
    if (out / "model.safetensors").is_file():
        return out
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    target = tmp / "wide-target"
    target.mkdir(parents=True)
    config = {"hidden_size": WIDE_HIDDEN, "num_hidden_layers": 4, "num_attention_heads": 4,
              "num_key_value_heads": 2, "head_dim": 24, "vocab_size": 512,
              "max_position_embeddings": 1024, "rms_norm_eps": 1e-6, "rope_theta": 10000.0}
    (target / "config.json").write_text(json.dumps(config))
    subprocess.run([sys.executable, "-m", "serving.tools.tiny_draft", "--target", str(target),
                    "--out", str(tmp / "draft")], check=True, capture_output=True)
    shutil.rmtree(out, ignore_errors=True)
    (tmp / "draft").rename(out)    # atomic: a half-written draft is never picked up
    shutil.rmtree(tmp)
    return out
