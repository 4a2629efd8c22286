"""`install-runtime --runtime sglang`: SGLang into /opt/sglang/venv on a host with no index access.

One pinned wheel list, built here and installed with --no-deps (pinned.py). Which list depends
on the host (docs/sglang.md "Install", measured 2026-12-04):
  - a host without a GPU gets SGLang 0.5.15's CPU engine. It is the last release whose CPU engine
    falls back to torch wherever sgl-kernel's CPU ops are absent; from 0.5.16 on,
    `mem_cache/allocation.py` and `kernels/ops/kvcache/cache_move.py` import those ops at module
    level, and no registry wheel carries them (sglang-kernel 0.4.10 is CUDA-only).
    0.5.15 imports `torchvision.io` at start, and every registry torchvision links
    libtorch_cuda: so the set holds the registry's CUDA torch 2.11.0 and torchvision 0.26.0
    (0.5.15's pins), never used for a GPU. SGLang itself goes in without its dependencies (they
    name CUDA kernels: sglang-kernel, flashinfer, flash-attn-4, ...), then its other
    dependencies are listed here with torch held;
  - a GPU host gets the release with its own pinned CUDA dependencies.
The check after install is SGLang's own argument parser: its version and every flag it defines.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

from ddops import exits
from ddops.install import pinned
from ddops.install.pinned import PeerReport, PinnedWheelhouse, Release
from ddops.remote import Remote

CPU_VERSION = "0.5.15"
VENV = "/opt/sglang/venv"
PYTHON = f"{VENV}/bin/python"
# Under the venv's folder: a lab host keeps /opt/sglang on disk, not in its RAM overlay.
WHEEL_DIR = "/opt/sglang/wheelhouse"
# SGLang 0.5.15's dependencies that a CPU engine imports, torch held at its pin; left out:
# sglang-kernel, flashinfer_python, flashinfer_cubin, flash-attn-4, cuda-python,
# nvidia-cutlass-dsl, nvidia-mathdx, kernels, quack-kernels, sgl-deep-gemm, tilelang,
# tokenspeed_mla, torch_memory_saver, torchao, torchaudio, torchcodec (CUDA-only or unused).
CPU_DEPENDENCIES = (
    "torch==2.11.0", "torchvision==0.26.0",
    "aiohttp", "anthropic>=0.20.0", "apache-tvm-ffi==0.1.11", "blobfile==3.0.0", "build", "compressed-tensors",
    "datasets", "distro", "easydict", "einops", "fastapi", "gguf", "interegular", "IPython",
    "llguidance>=0.7.11,<0.8.0", "mistral_common>=1.11.5", "modelscope", "msgspec", "ninja", "numpy",
    "nvidia-ml-py", "openai==2.6.1", "openai-harmony==0.0.4", "orjson", "outlines==0.1.11", "packaging",
    "partial_json_parser", "pillow", "prometheus-client>=0.20.0", "psutil", "py-spy", "pybase64", "pydantic",
    "python-multipart", "pyzmq>=25.1.2", "requests", "scipy", "sentencepiece", "setproctitle",
    "smg-grpc-servicer>=0.5.0", "soundfile==0.13.1", "tiktoken", "timm==1.0.16", "tqdm", "transformers==5.12.1",
    "uvicorn", "uvloop", "watchfiles", "xgrammar==0.2.1", "zstandard",
)
# Prints {"version", "flags"} from the installed SGLang's own parser (no model, no device).
PROBE = (
    "import argparse, json, importlib.metadata as m\n"
    "from sglang.srt.server_args import ServerArgs\n"
    "p = argparse.ArgumentParser()\n"
    "ServerArgs.add_cli_args(p)\n"
    "print(json.dumps({'version': m.version('sglang'), "
    "'flags': sorted(o for a in p._actions for o in a.option_strings if o.startswith('--'))}))\n"
)
PROBE_ENV = "HF_HUB_OFFLINE=1 HOME=/tmp"


def build_for(gpu) -> str:
    return "cpu" if gpu is None else "cuda"


def release(build: str, version: str | None = None) -> Release:
    """The wheel list for a build; a CPU host can only take CPU_VERSION (see above)."""
    if build == "cpu":
        if version not in (None, CPU_VERSION):
            raise exits.BadInput(
                f"--version {version}: on a host without a GPU ddops installs SGLang {CPU_VERSION}, the last "
                "release whose CPU engine runs without sgl-kernel's CPU ops, which no registry package carries "
                "(docs/sglang.md \"Install\")")
        return Release("sglang", "cpu", (CPU_DEPENDENCIES, ("--no-deps", f"sglang=={CPU_VERSION}")), VENV, WHEEL_DIR)
    return Release("sglang", "cuda", ((f"sglang=={version or CPU_VERSION}",),), VENV, WHEEL_DIR)


def build_wheelhouse(cache: Path, build: str, version: str | None = None, log=print) -> PinnedWheelhouse:
    return pinned.build_wheelhouse(cache, release(build, version), log)


def probe_installed(remote: Remote, python: str = PYTHON) -> dict:
    """The installed SGLang's version and flags from its own parser (~6 s of imports)."""
    result = remote.run(f"cd /tmp && {PROBE_ENV} {python} -c {shlex.quote(PROBE)}", timeout=300)
    lines = [line for line in result.stdout.splitlines() if line.startswith("{")]
    if not lines:
        raise exits.HostFailed(f"{remote.host.name}: SGLang's parser printed nothing: {result.stderr[-300:]}")
    return json.loads(lines[-1])


def install(remote: Remote, house: PinnedWheelhouse, log=print, progress=None) -> PeerReport:
    pushed = pinned.install_wheels(remote, house, log, progress, what=" (torch and its libraries take ~2 min)")
    remote.run(f"rm -rf {WHEEL_DIR}")     # 2.9 GB of wheels, all installed now; a rerun pushes none
    facts = probe_installed(remote)
    return PeerReport.of(remote, house, pushed, facts["version"], len(facts["flags"]))
