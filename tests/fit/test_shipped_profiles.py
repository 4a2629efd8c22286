"""The shipped A6000 profiles agree with the planner: each fits the 2 x RTX A6000 hosts the
example inventory declares (by the runtime's memory model), and none fits one card (the 27B bf16 weights alone exceed it)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ddops.fit import host_gpu, local_reader, needs_gpu, read_models
from ddops.fit.memory_models import predict
from ddops.inventory import load_inventory
from ddops.profile import list_profiles, load_profile
from tests.fit.conftest import CONFIGS

REPO = Path(__file__).resolve().parents[2]
GPU_PROFILES = [n for n in list_profiles(REPO / "profiles") if needs_gpu(load_profile(n, REPO / "profiles"))]
HOSTS = [h for h in load_inventory(REPO / "inventory.example.yaml").hosts.values() if h.gpu]


def test_there_are_gpu_profiles_and_gpu_hosts_to_check():
    assert {"a6000-base", "a6000-balanced", "a6000-shadow"} <= set(GPU_PROFILES)
    assert HOSTS and all(h.gpu.kind == "RTX A6000" and h.gpu.count == 2 for h in HOSTS)


@pytest.mark.parametrize("name", GPU_PROFILES)
def test_shipped_profile_fits_its_hosts(name):
    profile = load_profile(name, REPO / "profiles")
    models = read_models(profile, local_reader(CONFIGS))
    for host in HOSTS:
        assert profile.model.tp_size <= host.gpu.count
        result = predict(profile, host_gpu(host), models).assessment
        assert result.verdict.fits, (host.name, result.verdict.reasons)
        assert result.one_request_fits
        assert result.full_length_requests >= profile.memory.max_running_requests


@pytest.mark.parametrize("name", GPU_PROFILES)
def test_shipped_profile_does_not_fit_one_card(name):
    profile = load_profile(name, REPO / "profiles")
    result = predict(profile, host_gpu(HOSTS[0]), read_models(profile, local_reader(CONFIGS)), tp=1).assessment
    assert not result.verdict.fits and "weights alone" in result.verdict.reasons[0]
