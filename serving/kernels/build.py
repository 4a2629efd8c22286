"""Compile a C kernel of this folder once per host and source, load it with ctypes.

The shared object lands in a cache keyed by the source, the flags, the compiler's version and
the CPU's instruction-set flags (it is built with -march=native, so a cache shared between
unlike hosts must not hand one host the other's build). Compiling takes about a second; a
host without a C compiler, or whose compile fails, gets None and the reason, and the caller
runs its PyTorch form instead.

Flags: -ffast-math lets the compiler vectorise the float reductions and call glibc's vector
`expf` (libmvec declares it only under __FAST_MATH__); it is given to the compile step only,
because linking with it adds crtfastmath, which would switch the whole process's denormals
to zero.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch

from serving.device_memory import host_cpu_flags

HERE = Path(__file__).parent
COMPILE = ["-O3", "-march=native", "-ffast-math", "-fopenmp", "-fPIC", "-std=c11"]
LINK = ["-shared", "-fopenmp", "-lmvec", "-lm"]
CACHE_ENV = "DDOPS_KERNEL_CACHE"


def cache_dir() -> Path:
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    base = os.environ.get("XDG_CACHE_HOME") or (Path.home() / ".cache" if Path.home().is_dir() else None)
    return Path(base or tempfile.gettempdir()) / "ddops-kernels"


def _compiler_version(cc: str) -> str:
    return subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=30).stdout


@functools.cache
def load(name: str) -> tuple[ctypes.CDLL | None, str]:
    """(the library built from `name`.c, "") or (None, why not)."""
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        return None, "no C compiler on PATH (cc, gcc)"
    try:
        source = (HERE / f"{name}.c").read_bytes()      # shipped as package data (pyproject.toml)
        key = hashlib.sha256(b"\0".join([source, *_headers(source), " ".join(COMPILE + LINK).encode(),
                                         _compiler_version(cc).encode(),
                                         " ".join(sorted(host_cpu_flags())).encode()])).hexdigest()[:16]
        target = cache_dir() / f"{name}-{key}.so"
        if not target.exists():
            _compile(cc, HERE / f"{name}.c", target)
        return ctypes.CDLL(str(target)), ""
    except (OSError, subprocess.SubprocessError) as err:
        return None, f"{name}.c did not build or load: {str(err).strip()[:300]}"


def _headers(source: bytes) -> list[bytes]:
    """The bytes of this folder's headers a source includes (`#include "x.h"`): part of the
    build's key, so a changed header rebuilds every kernel that includes it."""
    names = re.findall(rb'^\s*#\s*include\s+"([^"]+)"', source, re.MULTILINE)
    return [(HERE / name.decode()).read_bytes() for name in names]


def _compile(cc: str, source: Path, target: Path) -> None:
    """Build into a private directory, then rename into place (concurrent builders never see a
    half-written library)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as work:
        obj, lib = Path(work) / "k.o", Path(work) / "k.so"
        for argv in ([cc, *COMPILE, "-c", str(source), "-o", str(obj)], [cc, str(obj), *LINK, "-o", str(lib)]):
            done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
            if done.returncode != 0:
                raise subprocess.SubprocessError(done.stderr or f"{argv[0]} exited {done.returncode}")
        os.replace(lib, target)


def serves(built: tuple, dtype, device, dtypes=(torch.float32,)) -> tuple[bool, str]:
    """(True, "") when a kernel `built` by `function` serves tensors of this dtype on this device
    (every kernel here runs on CPU, over the `dtypes` it names), else (False, why)."""
    if torch.device(device).type != "cpu" or dtype not in dtypes:
        names = " or ".join(str(d).removeprefix("torch.") for d in dtypes)
        return False, f"the kernel is for {names} on CPU, not {dtype} on {device}"
    return built[0] is not None, built[1]


def function(name: str, symbol: str, restype, argtypes: list, probe, reference: str):
    """(`symbol` of `name`.c, typed and probed, "") or (None, why not). probe(fn) -> bool runs
    it once beside `reference`, the PyTorch form it replaces."""
    lib, why = load(name)
    if lib is None:
        return None, why
    fn = getattr(lib, symbol)
    fn.restype, fn.argtypes = restype, argtypes
    return (fn, "") if probe(fn) else (None, f"the kernel disagreed with {reference} on the probe")
