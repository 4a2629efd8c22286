"""Every shipped profile loads, and the ones operators rely on say what they claim."""

from __future__ import annotations

import pytest

from ddops.profile import METHODS, list_profiles, load_profile, method_for
from tests.ops.helpers import SHIPPED

REQUIRED = ["a6000-base", "a6000-shadow", "a6000-shadow-small", "a6000-shadow-small-nograph",
            "a6000-balanced", "cpu-ar", "cpu-dflash", "cpu-ddtree", "cpu-smollm2-ar",
            "cpu-smollm2-ddtree"]


def test_required_profiles_are_shipped():
    assert set(REQUIRED) <= set(list_profiles(SHIPPED))


@pytest.mark.parametrize("name", list_profiles(SHIPPED))
def test_shipped_profile_validates(name):
    profile = load_profile(name, SHIPPED)
    assert profile.name == name
    assert profile.files[0].endswith(f"{name}.yaml")


@pytest.mark.parametrize("name", [n for n in REQUIRED if n.startswith("a6000")])
def test_a6000_profiles_pair_qwen_target_with_its_dflash_draft_under_ddtree(name):
    profile = load_profile(name, SHIPPED)
    assert profile.runtime == "sglang"
    assert profile.model.path.endswith("/Qwen3.6-27B")
    assert profile.speculative.draft_model_path.endswith("/Qwen3.6-27B-DFlash")
    assert profile.method.uses_tree_budget and profile.speculative.ddtree_budget >= 1


def test_a6000_balanced_is_the_configuration_that_started():
    profile = load_profile("a6000-balanced", SHIPPED)
    assert profile.memory.mem_fraction_static == 0.85
    assert profile.memory.context_length <= 8192
    assert profile.cuda_graph.enabled is False
    mamba = profile.mamba
    assert None not in (mamba.max_mamba_cache_size, mamba.ssm_dtype, mamba.full_memory_ratio,
                        mamba.scheduler_strategy)


def test_extends_chain_deep_merges_and_records_sources():
    profile = load_profile("a6000-shadow-small-nograph", SHIPPED)
    assert [f.rsplit("/", 1)[-1] for f in profile.files] == [
        "a6000-shadow-small-nograph.yaml", "a6000-shadow-small.yaml", "a6000-shadow.yaml",
        "a6000-base.yaml"]
    assert profile.memory.context_length == 8192  # from shadow-small
    assert profile.memory.mem_fraction_static == 0.84  # from base, untouched by children
    assert profile.source_of("memory.context_length").endswith("a6000-shadow-small.yaml")
    assert profile.source_of("memory.mem_fraction_static").endswith("a6000-base.yaml")
    assert profile.source_of("health.path") == "default"
    assert profile.service.environment["NO_PROXY"] == "127.0.0.1,localhost"


@pytest.mark.parametrize("name,expected", [("cpu-ar", "none"), ("cpu-dflash", "dflash"),
                                           ("cpu-ddtree", "ddtree")])
def test_cpu_profiles_cover_each_method(name, expected):
    profile = load_profile(name, SHIPPED)
    assert profile.runtime == "bundled" and profile.service.device == "cpu"
    assert profile.speculative.algorithm == expected
    assert profile.method.needs_draft == (profile.speculative.draft_model_path is not None)


def test_ddtree_inherits_hidden_capture_from_the_dflash_drafter():
    # by construction: the same drafter object, not a second flag someone must remember
    assert METHODS["ddtree"].drafter is METHODS["dflash"].drafter
    for name, method in METHODS.items():
        assert method.needs_target_hidden_capture == (method.drafter is not None
                                                      and method.drafter.captures_target_hidden)
    assert METHODS["ddtree"].needs_target_hidden_capture
    assert not METHODS["none"].is_speculative and not METHODS["none"].needs_draft


@pytest.mark.parametrize("spelling", ["ddtree", "DDTREE", "DDTree", " ddtree "])
def test_method_spellings_are_case_insensitive(spelling):
    assert method_for(spelling).sglang_name == "DDTREE"


def test_only_speculative_methods_have_an_sglang_name():
    for method in METHODS.values():
        assert (method.sglang_name is not None) == method.is_speculative
