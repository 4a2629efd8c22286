"""A peer runtime (vLLM, SGLang) as one pinned wheel list, installed into its own venv on a host
with no index access.

Built here once, cached under $DDOPS_CACHE/<name>-wheelhouse/KEY: every wheel the release needs,
resolved by pip (`pip download`), pinned name==version in requirements.txt. The host installs
exactly that list with --no-deps, so pip never resolves there, and only the wheels whose
name==version its venv lacks travel (a rerun pushes nothing). What each release needs beyond
that (its download recipe, the packages left out, the check that it really loads) is in its
own module: vllm.py, sglang.py.
"""

from __future__ import annotations

import hashlib
import os
import posixpath
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from ddops.file_lock import file_lock
from ddops.install.bundled import InstallPreview, installed_distributions, prepare_venv, venv_missing
from ddops.install.sync import SyncReport, sync_files
from ddops.install.wheelhouse import fresh, normalize, pip, python_tag, wheel_identity
from ddops.remote import Remote


@dataclass(frozen=True)
class Release:
    """One build of a peer runtime as ddops installs it."""
    name: str                            # "vllm", "sglang": the cache folder's and the host's names
    build: str                           # "cpu" or "cuda"
    downloads: tuple[tuple[str, ...], ...]   # `pip download` argument lists, run in turn
    venv: str                            # on the host, e.g. /opt/vllm/venv
    wheel_dir: str                       # where the wheels land on the host
    left_out: frozenset[str] = frozenset()   # downloaded as dependencies, never installed

    @property
    def python(self) -> str:
        return f"{self.venv}/bin/python"

    @property
    def key(self) -> str:
        """The cache key: this Python, the recipe and what is left out."""
        recipe = "\n".join(" ".join(args) for args in self.downloads)
        return hashlib.sha256(f"{python_tag()}\n{recipe}\n{sorted(self.left_out)}".encode()).hexdigest()[:12]

    def keeps(self, name: str) -> bool:
        """Whether a distribution (normalized name) goes into the host's venv."""
        return name not in {normalize(n) for n in self.left_out}


@dataclass(frozen=True)
class PinnedWheelhouse:
    directory: Path     # *.whl + requirements.txt (name==version, left_out removed)
    release: Release

    @property
    def build(self) -> str:
        return self.release.build

    @property
    def wheels(self) -> list[Path]:
        return sorted(w for w in self.directory.glob("*.whl") if self.release.keeps(wheel_identity(w)[0]))

    @property
    def requirements(self) -> Path:
        return self.directory / "requirements.txt"


def build_wheelhouse(cache: Path, release: Release, log=print) -> PinnedWheelhouse:
    """Every wheel the release needs, downloaded once and pinned (under a lock)."""
    root = cache / f"{release.name}-wheelhouse"
    directory = root / release.key
    with file_lock(root / ".lock"):
        if not (directory / ".complete").exists():
            log(f"{release.name} wheelhouse: downloading the {release.build} build with its dependencies "
                "(first time only)")
            work = fresh(directory.with_name(f".{release.key}.tmp{os.getpid()}"))
            for args in release.downloads:
                pip(["download", "-q", "--dest", str(work), *args])
            pinned = sorted(f"{name}=={version}" for name, version in map(wheel_identity, work.glob("*.whl"))
                            if release.keeps(name))
            (work / "requirements.txt").write_text("\n".join(pinned) + "\n")
            (work / ".complete").write_text("")
            shutil.rmtree(directory, ignore_errors=True)
            os.replace(work, directory)
    return PinnedWheelhouse(directory, release)


def missing(house: PinnedWheelhouse, installed: set[tuple[str, str]]) -> list[Path]:
    """Pure: the wheels whose exact name==version the host's venv lacks."""
    return [w for w in house.wheels if wheel_identity(w) not in installed]


@dataclass(frozen=True)
class Pushed:
    venv_created: bool
    wheels_installed: tuple[str, ...]
    bytes_pushed: int


def install_wheels(remote: Remote, house: PinnedWheelhouse, log=print, progress=None,
                   what: str = "") -> Pushed:
    """The host's venv made to hold every pinned wheel: push the missing ones, install them with
    --no-deps from the host's own folder, uninstall anything left out that got there."""
    release = house.release
    venv_created = prepare_venv(remote, release.venv, log)
    wanted = missing(house, installed_distributions(remote, release.venv))
    pushed: SyncReport | None = None
    if wanted:
        files = {w.name: w for w in wanted}
        files["requirements.txt"] = house.requirements
        log(f"  {remote.host.name}: pushing {len(wanted)} wheel(s) to {release.wheel_dir}")
        pushed = sync_files(remote, files, release.wheel_dir, log=lambda _: None, progress=progress)
        log(f"  {remote.host.name}: installing {len(wanted)} wheel(s) with --no-deps{what}")
        remote.run(f"{release.python} -m pip install -q --disable-pip-version-check --no-index --no-deps "
                   f"--find-links {release.wheel_dir} -r {posixpath.join(release.wheel_dir, 'requirements.txt')}",
                   timeout=1800)
        if release.left_out:
            stray = " ".join(sorted(release.left_out))
            remote.run(f"{release.python} -m pip uninstall -q -y {stray} 2>/dev/null || true", timeout=300)
    return Pushed(venv_created, tuple(w.name for w in wanted), pushed.bytes_copied if pushed else 0)


def preview(remote: Remote, house: PinnedWheelhouse) -> InstallPreview:
    """What install_wheels would do on this host now (read only)."""
    venv = house.release.venv
    wanted = missing(house, installed_distributions(remote, venv))
    return InstallPreview(remote.host.name, venv, venv_missing(remote, venv), tuple(w.name for w in wanted))


@dataclass(frozen=True)
class PeerReport:
    """What `install-runtime` says of one host (vLLM, SGLang)."""
    host: str
    build: str
    venv_created: bool
    wheels_installed: tuple[str, ...]
    bytes_pushed: int
    version: str            # what the installed runtime's own parser reports
    flags: int              # how many flags that parser defines

    @classmethod
    def of(cls, remote: Remote, house: PinnedWheelhouse, pushed: Pushed, version: str, flags: int) -> "PeerReport":
        return cls(remote.host.name, house.build, pushed.venv_created, pushed.wheels_installed, pushed.bytes_pushed,
                   version, flags)


def install_local(venv: Path, cache: Path, release: Release, log=print) -> None:
    """The same wheels into a venv on this machine (the peer the tests and benchmarks run);
    `.installed` marks it complete, so a rerun does nothing."""
    marker = venv / ".installed"
    if marker.exists():
        return
    house = build_wheelhouse(cache, release, log)
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
    subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                    "--no-index", "--no-deps", "--find-links", str(house.directory), "-r", str(house.requirements)],
                   check=True)
    marker.write_text(" ".join(release.downloads[-1]) + "\n")
    log(f"{venv}: {release.name} ({release.build} build) installed ({len(house.wheels)} wheels"
        + (f", no {', '.join(sorted(release.left_out))})" if release.left_out else ")"))
