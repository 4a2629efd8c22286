"""`install-runtime` of the bundled runtime (`vllm.py` installs vLLM): put it into /opt/ddops/venv
on a host with no index access.

Only what the host lacks travels: dependency wheels whose name==version is not installed in the
host's venv yet (none on a lab host booted from the runtime layer), plus the project wheel when
its source hash differs from the one recorded on the host.
"""

import posixpath
import re
import shlex
from dataclasses import dataclass

from ddops.install.sync import sync_files
from ddops.install.wheelhouse import Bundle, normalize, wheel_identity
from ddops.remote import Remote

VENV = "/opt/ddops/venv"
PYTHON = f"{VENV}/bin/python"
WHEEL_DIR = "/var/lib/ddops/wheelhouse"
MARKER = f"{VENV}/.ddops-source-sha256"
# The services run as this unprivileged system user (the profile's service.user default):
# no login shell, no home, no password.
SERVICE_USER = "ddops"
ADD_USER = (f"id -u {SERVICE_USER} >/dev/null 2>&1 || useradd --system --user-group --no-create-home "
            f"--home-dir /nonexistent --shell /usr/sbin/nologin {SERVICE_USER}")


@dataclass(frozen=True)
class InstallReport:
    host: str
    venv_created: bool
    dependencies_installed: tuple[str, ...]   # wheel file names pushed and installed
    project_installed: bool                   # False: the same sources were already installed
    bytes_pushed: int
    check: str                                # first line of `python -m serving --help`


def installed_distributions(remote: Remote, venv: str = VENV) -> set[tuple[str, str]]:
    """(normalized name, version) of every distribution in the host's venv, from its dist-info dirs."""
    out = remote.run(f"ls -d {venv}/lib/python3*/site-packages/*.dist-info 2>/dev/null || true").stdout
    found = set()
    for line in out.split():
        match = re.match(r"(.+?)-([^-]+)\.dist-info$", posixpath.basename(line))
        if match:
            found.add((normalize(match.group(1)), match.group(2)))
    return found


def missing_wheels(bundle: Bundle, installed: set[tuple[str, str]]) -> list:
    """Pure: the dependency wheels whose exact name==version the host does not have."""
    return [w for w in bundle.wheelhouse.wheels if wheel_identity(w) not in installed]


def prepare_venv(remote: Remote, venv: str, log=print) -> bool:
    """The service user and `venv` on the host; True when the venv was created now."""
    remote.run(ADD_USER)
    created = venv_missing(remote, venv)
    if created:
        log(f"  {remote.host.name}: creating {venv}")
        remote.run(f"python3 -m venv {venv}", timeout=300)
    return created


@dataclass(frozen=True)
class InstallPreview:
    """What `install-runtime` would do on one host (`--dry-run`: read only)."""
    host: str
    venv: str
    venv_created: bool
    wheels: tuple[str, ...]          # wheels it would push and install
    project: bool | None = None      # the ddops wheel installed again (bundled only)


def venv_missing(remote: Remote, venv: str) -> bool:
    return not remote.exists(f"{venv}/bin/python")


def preview(remote: Remote, bundle: Bundle) -> InstallPreview:
    missing = missing_wheels(bundle, installed_distributions(remote))
    return InstallPreview(remote.host.name, VENV, venv_missing(remote, VENV), tuple(w.name for w in missing),
                          (remote.read_text(MARKER) or "").strip() != bundle.project_sha256)


def install_runtime(remote: Remote, bundle: Bundle, log=print, progress=None) -> InstallReport:
    venv_created = prepare_venv(remote, VENV, log)
    missing = missing_wheels(bundle, installed_distributions(remote))
    files = {w.name: w for w in missing}
    files[bundle.project_wheel.name] = bundle.project_wheel
    if missing:
        files["requirements.txt"] = bundle.wheelhouse.requirements
    log(f"  {remote.host.name}: pushing {len(files)} wheel(s) to {WHEEL_DIR}")
    pushed = sync_files(remote, files, WHEEL_DIR, log=lambda _: None, progress=progress)
    pip = f"{PYTHON} -m pip install -q --disable-pip-version-check --no-index"
    if missing:
        log(f"  {remote.host.name}: installing {len(missing)} dependency wheel(s) (torch takes ~40 s)")
        remote.run(f"{pip} --find-links {WHEEL_DIR} -r {WHEEL_DIR}/requirements.txt", timeout=1200)
    project_installed = (remote.read_text(MARKER) or "").strip() != bundle.project_sha256
    if project_installed:
        wheel = shlex.quote(posixpath.join(WHEEL_DIR, bundle.project_wheel.name))
        remote.run(f"{pip} --no-deps --force-reinstall {wheel}", timeout=300)
        remote.write(MARKER, bundle.project_sha256 + "\n")
    check = remote.run(f"{PYTHON} -m serving --help", timeout=120).stdout
    return InstallReport(remote.host.name, venv_created, tuple(w.name for w in missing), project_installed,
                         pushed.bytes_copied, next((line.strip() for line in check.splitlines() if line.strip()), ""))
