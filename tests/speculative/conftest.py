"""Tiny fp32 targets (Llama, Qwen3) with matching DFlash drafts, built once per session.

Random drafts are written to a temporary directory (a second). Distilled drafts (real
acceptance) take ~half a minute each and are cached under $DDOPS_CACHE/models, keyed by
a digest of the target weights and the draft tools, so a change to the recipe rebuilds them.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

import pytest
import torch

from serving.models import inspect_checkpoint, load_model
from serving.tools.tiny import write_tiny
from serving.tools.tiny_draft import write_tiny_draft

ARCHES = ("llama", "qwen3")
ROOT = Path(__file__).resolve().parents[2]
DRAFT_TOOLS = ("serving/tools/draft_files.py", "serving/tools/tiny_draft.py", "serving/tools/train_draft.py",
               "serving/models/cpu_gemm.py")   # the target's head is in the training graph


@pytest.fixture(scope="session", autouse=True)
def few_threads():
    torch.set_num_threads(1)


@pytest.fixture(scope="session")
def tiny_dirs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tiny")
    return {arch: write_tiny(root / arch, arch) for arch in ARCHES}


@pytest.fixture(scope="session")
def random_drafts(tiny_dirs, tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("drafts")
    return {arch: write_tiny_draft(d, root / arch, seed=1) for arch, d in tiny_dirs.items()}


def cached_distilled_draft(target: Path, cache_dir: Path, name: str, tools=DRAFT_TOOLS) -> Path:
    """The distilled draft of `target` under $DDOPS_CACHE/models/tiny-<name>-dflash-distilled-<digest>,
    keyed by the target's weights and the draft tools; built once, atomically, older builds removed."""
    digest = hashlib.sha256((target / "model.safetensors").read_bytes())
    for tool in tools:
        digest.update((ROOT / tool).read_bytes())
    path = cache_dir / "models" / f"tiny-{name}-dflash-distilled-{digest.hexdigest()[:12]}"
    if not (path / "model.safetensors").exists():
        tmp = path.with_name(path.name + f".tmp{os.getpid()}")
        write_tiny_draft(target, tmp, seed=0, distill=True)
        try:
            tmp.rename(path)  # atomic: a half-written draft is never picked up
        except OSError:  # another test session built the same draft meanwhile: keep theirs
            shutil.rmtree(tmp, ignore_errors=True)
        for stale in path.parent.glob(f"tiny-{name}-dflash-distilled-*"):  # built by older tools
            if stale != path and ".tmp" not in stale.name:
                shutil.rmtree(stale, ignore_errors=True)
    return path


@pytest.fixture(scope="session")
def distilled_drafts(tiny_dirs, cache_dir) -> dict[str, Path]:
    return {arch: cached_distilled_draft(target, cache_dir, arch) for arch, target in tiny_dirs.items()}


@pytest.fixture(scope="session")
def targets(tiny_dirs):
    return {arch: load_model(inspect_checkpoint(d), torch.float32, "cpu", 1024) for arch, d in tiny_dirs.items()}
