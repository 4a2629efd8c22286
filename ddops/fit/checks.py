"""The fit check where it matters: `ddops validate` warns, `ddops deploy` refuses (unless --force).

A profile is checked against each GPU its inventory hosts declare (hosts with enough GPUs for
its tp_size; the same declaration is checked once). Models are read through a Reader: local
copies for validate, the host itself over SSH for deploy. A model that cannot be read is a
note, never a failure here: `ddops preflight` owns missing files.
"""

from __future__ import annotations

from dataclasses import dataclass

from ddops.fit.memory_models import checked_on, host_memory_reader, predict, sizes_from_host_memory
from ddops.fit.model import ModelFactsError
from ddops.fit.profile_fit import Reader, cpu_device, host_gpu, needs_gpu, read_models, remote_reader
from ddops.inventory import Host
from ddops.checkpoint import PreflightError
from ddops.profile import Profile


@dataclass(frozen=True)
class FitCheck:
    host: str
    gpu: str  # "2 x RTX A6000"
    fits: bool
    reasons: tuple[str, ...]

    def line(self, profile: str) -> str:
        why = f": {self.reasons[0]}" if self.reasons else ""
        return (f"{profile}: predicted not to fit {self.host} ({self.gpu}){why} "
                f"(`ddops fit {profile} --host {self.host}` shows the numbers)")


def check_host(profile: Profile, host: Host, read: Reader) -> FitCheck | None:
    """None when the check does not apply (memory_models.checked_on); raises
    PreflightError/ModelFactsError when unreadable."""
    if not checked_on(profile, host):
        return None
    gpu = host_gpu(host) if needs_gpu(profile) else None
    where = f"{profile.model.tp_size} x {gpu.name}" if gpu else "CPU"
    prediction = predict(profile, gpu, read_models(profile, read))
    return FitCheck(host.name, where, prediction.fits, prediction.reasons)


def check_hosts(profile: Profile, hosts: list[Host], read: Reader) -> tuple[list[FitCheck], list[str]]:
    """(one check per distinct GPU declaration, notes for what could not be checked)."""
    checks, notes, seen = [], [], set()
    for host in hosts:
        key = (host.gpu.kind, host.gpu.memory_gb) if host.gpu else None
        if key in seen or not checked_on(profile, host):
            continue
        seen.add(key)
        try:
            checks.append(check_host(profile, host, read))
        except (PreflightError, ModelFactsError) as exc:
            notes.append(f"{profile.name}: fit not checked ({exc}); pass --models DIR with local copies")
            break
    return checks, notes


def check_on_host(profile: Profile, host: Host, remote, unit: str | None = None) -> FitCheck | None:
    """Deploy's check: the models as the host holds them, read over its SSH connection; for a
    runtime that sizes its pool from the host's RAM, that RAM as it is now, with what `unit` (the
    one the deploy replaces) holds counted as free. None when it does not apply or the configs
    cannot be read there (preflight's concern)."""
    try:
        if sizes_from_host_memory(profile):
            return _check_host_memory(profile, host, remote, unit or profile.service.unit)
        return check_host(profile, host, remote_reader(remote))
    except (PreflightError, ModelFactsError):
        return None


def _check_host_memory(profile: Profile, host: Host, remote, unit: str) -> FitCheck | None:
    memory = host_memory_reader(profile)(remote, unit)
    if memory is None:
        return None
    prediction = predict(profile, None, read_models(profile, remote_reader(remote)), memory=memory)
    return FitCheck(host.name, cpu_device(memory).name, prediction.fits, prediction.reasons)
