"""Build what a host needs to run the bundled runtime, here, once: the project wheel and a
wheelhouse of its runtime dependencies (core + `serving` extra, torch pinned to the CPU build).

Both are cached under $DDOPS_CACHE: the wheelhouse keyed by the dependency list (and this
Python), the project wheel keyed by a hash of its source files.
"""

import hashlib
import os
import re
import shutil
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

from ddops import exits
from ddops.file_lock import file_lock

SOURCE_PACKAGES = ("ddops", "serving")
SOURCE_FILES = ("pyproject.toml", "README.md")


@dataclass(frozen=True)
class Wheelhouse:
    directory: Path           # *.whl + requirements.txt (every wheel pinned name==version)
    key: str                  # hash of the dependency list and Python tag

    @property
    def wheels(self) -> list[Path]:
        return sorted(self.directory.glob("*.whl"))

    @property
    def requirements(self) -> Path:
        return self.directory / "requirements.txt"


@dataclass(frozen=True)
class Bundle:
    """Everything install-runtime pushes."""

    wheelhouse: Wheelhouse
    project_wheel: Path
    project_sha256: str


def source_root() -> Path:
    root = Path(__file__).resolve().parents[2]
    if not (root / "pyproject.toml").is_file():
        raise exits.BadInput(f"{root}/pyproject.toml: not found; install-runtime builds from the ddops source tree")
    return root


def runtime_requirements(pyproject: Path) -> list[str]:
    """Core dependencies plus the `serving` extra, in file order, without duplicates."""
    try:
        project = tomllib.loads(pyproject.read_text())["project"]
        reqs = [*project["dependencies"], *project["optional-dependencies"]["serving"]]
    except (OSError, KeyError, tomllib.TOMLDecodeError) as exc:
        raise exits.BadInput(f"{pyproject}: cannot read project.dependencies / optional-dependencies.serving: {exc}") from None
    return list(dict.fromkeys(reqs))


def wheel_identity(wheel: Path) -> tuple[str, str]:
    """(normalized distribution name, version) from a wheel file name (PEP 427)."""
    name, version = wheel.name.split("-")[:2]
    return normalize(name), version


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


def python_tag() -> str:
    return f"cp{sys.version_info.major}{sys.version_info.minor}-{sys.platform}-{os.uname().machine}"


def build_wheelhouse(cache: Path, requirements: list[str], log=print) -> Wheelhouse:
    key = hashlib.sha256("\n".join([python_tag(), *requirements]).encode()).hexdigest()[:12]
    directory = cache / "wheelhouse" / key
    if (directory / ".complete").exists():
        return Wheelhouse(directory, key)
    log(f"wheelhouse: building {len(requirements)} requirements with their dependencies (first time only)")
    work = fresh(directory.with_name(f".{key}.tmp{os.getpid()}"))
    (work / "wanted.txt").write_text("\n".join(requirements) + "\n")
    pip(["wheel", "-q", "--wheel-dir", str(work), "-r", str(work / "wanted.txt")])
    pinned = sorted(f"{name}=={version}" for name, version in map(wheel_identity, work.glob("*.whl")))
    (work / "requirements.txt").write_text("\n".join(pinned) + "\n")
    (work / ".complete").write_text("")
    shutil.rmtree(directory, ignore_errors=True)
    os.replace(work, directory)
    return Wheelhouse(directory, key)


def source_digest(root: Path) -> str:
    digest = hashlib.sha256()
    for path in source_files(root):
        digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def source_files(root: Path) -> list[Path]:
    files = [root / name for name in SOURCE_FILES if (root / name).is_file()]
    for package in SOURCE_PACKAGES:
        files += [p for p in (root / package).rglob("*")
                  if p.is_file() and "__pycache__" not in p.parts and not p.name.endswith(".pyc")]
    return sorted(files)


def build_project_wheel(cache: Path, root: Path, log=print) -> tuple[Path, str]:
    """The project wheel for the current sources, built from a copy (never writes into the checkout)."""
    sha = source_digest(root)
    out = cache / "wheels" / sha[:16]
    wheels = sorted(out.glob("ddops-*.whl")) if (out / ".complete").exists() else []
    if wheels:
        return wheels[0], sha
    log("wheel: building the ddops wheel from the current sources")
    work = fresh(out.with_name(f".{sha[:16]}.tmp{os.getpid()}"))
    tree = work / "src"
    for path in source_files(root):
        target = tree / path.relative_to(root)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, target)
    pip(["wheel", "-q", "--no-deps", "--no-build-isolation", "--wheel-dir", str(work), str(tree)])
    shutil.rmtree(tree)
    (work / ".complete").write_text("")
    shutil.rmtree(out, ignore_errors=True)
    os.replace(work, out)
    return sorted(out.glob("ddops-*.whl"))[0], sha


def build_bundle(cache: Path, log=print) -> Bundle:
    """Wheelhouse + project wheel, built under a lock: concurrent sessions share the cache."""
    root = source_root()
    with file_lock(cache / "wheelhouse" / ".lock"):
        house = build_wheelhouse(cache, runtime_requirements(root / "pyproject.toml"), log)
        wheel, sha = build_project_wheel(cache, root, log)
    return Bundle(house, wheel, sha)


def pip(args: list[str]) -> None:
    proc = subprocess.run([sys.executable, "-m", "pip", *args], capture_output=True, text=True)
    if proc.returncode != 0:
        tail = [line for line in (proc.stderr or proc.stdout).splitlines() if line.strip()][-1:] or ["(no output)"]
        raise exits.HostFailed(f"pip {args[0]}: exit {proc.returncode}: {tail[0].strip()}")


def fresh(path: Path) -> Path:
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    return path
