"""SSH keys of a lab: one client key for root on every host, one host key per host made here.

Host keys are generated on this machine before the host boots, so known_hosts is written from
keys we made, never from what a host happens to present (no trust on first use).
"""

import os
from pathlib import Path

from ddops.lab import local_commands
from ddops.lab.layout import HostSlot, LabLayout


def ensure_keypair(path: Path, comment: str) -> Path:
    """An ed25519 key pair at path/path.pub (kept if already there, so host keys survive `lab up` re-runs)."""
    if not (path.exists() and path.with_suffix(".pub").exists()):
        path.parent.mkdir(parents=True, exist_ok=True)
        for stale in (path, path.with_suffix(".pub")):
            stale.unlink(missing_ok=True)
        local_commands.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)])
    path.chmod(0o600)
    return path


def host_key(layout: LabLayout, slot: HostSlot) -> Path:
    return ensure_keypair(layout.host_dir(slot.name) / "ssh_host_ed25519_key", f"root@{slot.name}")


def known_hosts_line(slot: HostSlot, public_key: str) -> str:
    """`address type base64`; port 22, so no [addr]:port form."""
    key_type, key_b64 = public_key.split()[:2]
    return f"{slot.address} {key_type} {key_b64}\n"


def write_known_hosts(layout: LabLayout, slots: list[HostSlot]) -> Path:
    lines = [known_hosts_line(s, (layout.host_dir(s.name) / "ssh_host_ed25519_key.pub").read_text())
             for s in slots]
    write_atomic(layout.known_hosts, "".join(lines), 0o644)
    return layout.known_hosts


def write_atomic(path: Path, text: str, mode: int) -> None:
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text(text)
    tmp.chmod(mode)
    os.replace(tmp, path)
