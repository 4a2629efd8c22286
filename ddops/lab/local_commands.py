"""Local commands for the lab (ip, systemd-nspawn, debootstrap, tar): the lab's only subprocess edge."""

import os
import subprocess
from collections.abc import Sequence

from ddops.lab.errors import LabError, NotRootError


def run(argv: Sequence[str], check: bool = True, timeout: float = 600, **kwargs) -> subprocess.CompletedProcess:
    """Run argv, capturing text output; on failure raise LabError naming the command and its last stderr line."""
    try:
        proc = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, **kwargs)
    except FileNotFoundError:
        raise LabError(f"{argv[0]}: command not found (run `make setup` to install the lab's apt packages)") from None
    except subprocess.TimeoutExpired:
        raise LabError(f"{' '.join(argv[:3])}: no result after {timeout:.0f} s") from None
    if check and proc.returncode != 0:
        raise LabError(f"{' '.join(argv[:4])}: exit {proc.returncode}: {last_line(proc.stderr or proc.stdout)}")
    return proc


def last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else "(no output)"


def require_root(action: str) -> None:
    if os.geteuid() != 0:
        raise NotRootError(f"{action} needs root (it creates network namespaces, a bridge and containers); "
                           "run it with sudo or as root")
