"""The fit check where it matters: `ddops validate` warns, `ddops deploy` refuses (unless --force).

A profile is checked against each GPU its inventory hosts declare (hosts with enough GPUs for
its tp_size; the same declaration is checked once). Models are read through a Reader: local
copies for validate, the host itself over SSH for deploy. A model that cannot be read is a
note, never a failure here: `ddops preflight` owns missing files.
"""

from __future__ import annotations

from dataclasses import dataclass

from ddops.fit.model import ModelFactsError
from ddops.fit.profile_fit import (Reader, cpu_device, fit_profile, free_at_load, host_gpu, needs_gpu, predict, read_models,
                                   sizes_from_host_memory)
from ddops.fit.shape import tp_problems
from ddops.inventory import Host
from ddops.checkpoint import PreflightError
from ddops.profile import RUNTIMES, Profile


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


def applies(profile: Profile, host: Host) -> bool:
    """A GPU memory model fit predicts (SGLang's pools, vLLM's blocks) on a host that declares
    enough GPUs for the profile; or vLLM's CPU build, whose K/V is the space its profile sets
    (VLLM_CPU_KVCACHE_SPACE), on any host."""
    model = RUNTIMES[profile.runtime].memory_model
    if not needs_gpu(profile):
        return model == "blocks"
    return (model in ("pools", "blocks")
            and host.gpu is not None and host.gpu.count >= profile.model.tp_size)


def check_host(profile: Profile, host: Host, read: Reader) -> FitCheck | None:
    """None when the check does not apply; raises PreflightError/ModelFactsError when unreadable."""
    if not applies(profile, host):
        return None
    gpu = host_gpu(host) if needs_gpu(profile) else None
    models = read_models(profile, read)
    where = f"{profile.model.tp_size} x {gpu.name}" if gpu else "CPU"
    bad_tp = tp_problems(models.target, models.draft, profile.model.tp_size)
    if bad_tp:
        return FitCheck(host.name, where, False, tuple(bad_tp))
    verdict = predict(profile, gpu, models).verdict
    return FitCheck(host.name, where, verdict.fits, verdict.reasons)


def check_hosts(profile: Profile, hosts: list[Host], read: Reader) -> tuple[list[FitCheck], list[str]]:
    """(one check per distinct GPU declaration, notes for what could not be checked)."""
    checks, notes, seen = [], [], set()
    for host in hosts:
        key = (host.gpu.kind, host.gpu.memory_gb) if host.gpu else None
        if key in seen or not applies(profile, host):
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
    from ddops.fit.profile_fit import remote_reader
    try:
        if sizes_from_host_memory(profile):
            return _check_host_memory(profile, host, remote, unit or profile.service.unit)
        return check_host(profile, host, remote_reader(remote))
    except (PreflightError, ModelFactsError):
        return None


def _check_host_memory(profile: Profile, host: Host, remote, unit: str) -> FitCheck | None:
    from ddops.fit.host_memory import read_node_memory
    from ddops.fit.profile_fit import remote_reader
    memory = read_node_memory(remote, unit)
    if memory is None:
        return None
    device = cpu_device(memory)
    verdict = fit_profile(profile, device, read_models(profile, remote_reader(remote)),
                          available=free_at_load(memory)).verdict
    return FitCheck(host.name, device.name, verdict.fits, verdict.reasons)
