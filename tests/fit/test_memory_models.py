"""The one choice by memory model (ddops.fit.memory_models): every runtime's model has its row,
the tensor-parallel shape rules refuse SGLang's and vLLM's profiles once, before any arithmetic,
and the bundled runtime (whose loader splits nothing) is predicted whatever the tp."""

from __future__ import annotations

import typing
from pathlib import Path

import pytest

from ddops.fit import find_gpu, local_reader, read_models
from ddops.fit.bundled import BundledFit
from ddops.fit.memory_models import MEMORY_MODELS, predict
from ddops.fit.verdict import Assessment
from ddops.fit.vllm_fit import VllmAssessment
from ddops.profile import RUNTIMES, load_profile
from ddops.profile.runtimes import Runtime
from tests.fit.conftest import CONFIGS

PROFILES = Path(__file__).resolve().parents[2] / "profiles"
A6000 = find_gpu("a6000")


def test_every_memory_model_has_its_row():
    declared = typing.get_args(typing.get_type_hints(Runtime)["memory_model"])
    assert set(declared) == set(MEMORY_MODELS) >= {r.memory_model for r in RUNTIMES.values()}


@pytest.mark.parametrize("name, kind", [("a6000-base", Assessment), ("a6000-vllm", VllmAssessment),
                                        ("cpu-smollm2-ar", BundledFit)])
def test_the_runtime_picks_the_arithmetic(name, kind):
    profile = load_profile(name, PROFILES)
    prediction = predict(profile, A6000, read_models(profile, local_reader(CONFIGS)))
    assert isinstance(prediction.assessment, kind) and not prediction.shape_refused
    assert prediction.fits


@pytest.mark.parametrize("name", ["a6000-base", "a6000-vllm"])
def test_a_tp_that_splits_heads_unevenly_is_refused_before_any_arithmetic(name):
    profile = load_profile(name, PROFILES)
    prediction = predict(profile, A6000, read_models(profile, local_reader(CONFIGS)), tp=3)
    assert prediction.shape_refused and not prediction.fits and prediction.assessment is None
    assert "tp 3 does not" in prediction.reasons[0]


def test_the_bundled_runtime_has_no_shape_rules():
    profile = load_profile("cpu-smollm2-ar", PROFILES)
    prediction = predict(profile, None, read_models(profile, local_reader(CONFIGS)), tp=7)
    assert isinstance(prediction.assessment, BundledFit) and not prediction.shape_refused


@pytest.mark.parametrize("name, kind", [("a6000-base", Assessment), ("a6000-vllm", VllmAssessment)])
def test_a_shadow_beside_production_is_judged_by_its_own_runtimes_arithmetic(name, kind):
    """What production leaves free (8 GiB of an A6000) holds neither 27B shadow; each is refused
    with its own runtime's reasons (the shadow's check once used SGLang's pools for every runtime)."""
    from ddops.rollout.shadow.lifecycle import fits_beside
    profile = load_profile(name, PROFILES)
    models = read_models(profile, local_reader(CONFIGS))
    beside = fits_beside(profile, 8 * 1024, models, "lab-1")
    assert isinstance(beside.assessment, kind) and not beside.fits and beside.reasons
    assert predict(profile, A6000, models).fits
