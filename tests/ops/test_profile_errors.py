"""Each kind of bad profile gives one line per problem: file, key path, line, reason."""

from __future__ import annotations

import pytest

from ddops.profile import ProfileError, load_profile
from tests.ops.helpers import BASE, only_problem, problems_of, write


def test_unknown_key_names_file_key_line_and_suggests(tmp_path):
    write(tmp_path, "p", BASE + "memory:\n  contex_length: 512\n")
    line = only_problem(tmp_path, "p")
    assert line == ("{}: memory.contex_length (line 6): unknown key (did you mean "
                    "'context_length'?)").format(line.split(":")[0])
    assert line.split(":")[0].endswith("p.yaml")


def test_unknown_top_level_section(tmp_path):
    write(tmp_path, "p", BASE + "gpus: 2\n")
    assert "gpus (line 5): unknown key" in only_problem(tmp_path, "p")


def test_wrong_type_is_not_coerced(tmp_path):
    write(tmp_path, "p", BASE + "service:\n  port: '30000'\n")
    line = only_problem(tmp_path, "p")
    assert "service.port (line 6): input should be a valid integer (got '30000')" in line


@pytest.mark.parametrize("key,section,value", [
    ("mem_fraction_static", "memory", "0"),
    ("mem_fraction_static", "memory", "1.2"),
    ("port", "service", "0"),
    ("port", "service", "70000"),
    ("ddtree_budget", "speculative", "0"),
    ("chunked_prefill_size", "memory", "0"),
    ("max_tokens", "smoke", "1"),
])
def test_out_of_range(tmp_path, key, section, value):
    write(tmp_path, "p", BASE + f"{section}:\n  {key}: {value}\n")
    problems = problems_of(tmp_path, "p")
    assert any(f"{section}.{key} (line 6):" in p for p in problems), problems


def test_fraction_of_exactly_one_is_allowed(tmp_path):
    write(tmp_path, "p", BASE + "memory:\n  mem_fraction_static: 1.0\n")
    assert load_profile("p", tmp_path).memory.mem_fraction_static == 1.0


def test_missing_parent(tmp_path):
    write(tmp_path, "child", "extends: nowhere\n")
    line = only_problem(tmp_path, "child")
    assert "child.yaml: extends (line 1): unknown parent profile 'nowhere'" in line


def test_extends_cycle(tmp_path):
    write(tmp_path, "a", "extends: b\n")
    write(tmp_path, "b", "extends: c\n")
    write(tmp_path, "c", "extends: a\n")
    assert "cycle: a -> b -> c -> a" in only_problem(tmp_path, "a")


def test_bad_yaml_names_the_line(tmp_path):
    write(tmp_path, "p", BASE + "memory:\n  context_length: [1\n  x: 2\n")
    line = only_problem(tmp_path, "p")
    assert "p.yaml: (line " in line and "bad YAML" in line


def test_duplicate_key_is_an_error_not_last_wins(tmp_path):
    write(tmp_path, "p", BASE + "service:\n  port: 1\n  port: 2\n")
    assert "service.port (line 7): duplicate key" in only_problem(tmp_path, "p")


def test_missing_required_key_points_at_the_parent_section(tmp_path):
    write(tmp_path, "p", "runtime: bundled\nmodel:\n  path: /m\n")
    assert "model.served_name (line 2): required key is missing" in only_problem(tmp_path, "p")


@pytest.mark.parametrize("text,kind", [("- a\n- b\n", "list"), ("", "an empty file")])
def test_top_level_must_be_a_mapping(tmp_path, text, kind):
    write(tmp_path, "p", text)
    assert f"top level must be a mapping, got {kind}" in only_problem(tmp_path, "p")


def test_name_comes_from_the_file(tmp_path):
    write(tmp_path, "p", BASE + "name: other\n")
    assert "name (line 5): not allowed" in only_problem(tmp_path, "p")


def test_unknown_method_lists_the_known_ones(tmp_path):
    write(tmp_path, "p", BASE + "speculative:\n  algorithm: eagle3\n")
    line = only_problem(tmp_path, "p")
    assert "speculative.algorithm (line 6): unknown method 'eagle3'; one of none, dflash, ddtree" in line


@pytest.mark.parametrize("extra,key,reason", [
    ("speculative:\n  draft_model_path: /d\n", "speculative.draft_model_path", "uses no draft model"),
    ("speculative:\n  algorithm: dflash\n", "speculative.draft_model_path", "required"),
    ("speculative:\n  algorithm: dflash\n  draft_model_path: /d\n  ddtree_budget: 8\n",
     "speculative.ddtree_budget", "does not verify a tree"),
    ("speculative:\n  block_size: 16\n", "speculative.block_size", "drafts nothing"),
    ("model:\n  tp_size: 2\n", "model.tp_size", "runtime bundled has no flag"),
    ("mamba:\n  ssm_dtype: bfloat16\n", "mamba.ssm_dtype", "runtime bundled has no flag"),
    ("memory:\n  kv_cache_dtype: fp8_e4m3\n", "memory.kv_cache_dtype", "runtime bundled has no flag"),
    ("sglang_version: 0.5.15\n", "sglang_version", "set, but runtime is bundled"),
    ("cuda_graph:\n  enabled: false\n  max_bs: 8\n", "cuda_graph.max_bs", "cuda_graph.enabled is false"),
    ("service:\n  secrets:\n    api_key_env: K\n    api_key_file: /k\n", "service.secrets", "not both"),
    ("service:\n  environment:\n    DDOPS_API_KEY: sk-oops\n", "service.environment.DDOPS_API_KEY",
     "reserved"),
])
def test_contradictions(tmp_path, extra, key, reason):
    write(tmp_path, "parent", BASE)
    write(tmp_path, "p", "extends: parent\n" + extra)
    line = only_problem(tmp_path, "p")
    assert line.split(":")[0].endswith("/p.yaml"), line
    assert f": {key} (line " in line and reason in line, line


def test_sglang_only_settings_are_fine_on_sglang(tmp_path):
    write(tmp_path, "p", BASE.replace("bundled", "sglang") + "  tp_size: 2\nmamba:\n  ssm_dtype: bfloat16\n")
    profile = load_profile("p", tmp_path)
    assert profile.model.tp_size == 2 and profile.mamba.ssm_dtype == "bfloat16"


SPECULATE = "speculative:\n  algorithm: dflash\n  draft_model_path: /var/lib/ddops/models/d\n"


def test_sglang_speculates_only_on_a_gpu(tmp_path):
    """The runtime table's speculates_on: SGLang's CPU engine serves plain decoding only."""
    write(tmp_path, "p", BASE.replace("bundled", "sglang") + "service:\n  device: cpu\n" + SPECULATE)
    assert "speculative.algorithm (line 8): runtime sglang cannot run a speculative method on device cpu" \
        in only_problem(tmp_path, "p")
    for runtime, device in (("sglang", "cuda"), ("bundled", "cpu")):
        write(tmp_path, "q", BASE.replace("bundled", runtime) + f"service:\n  device: {device}\n" + SPECULATE)
        assert load_profile("q", tmp_path).method.is_speculative


def test_problem_in_a_parent_names_the_parent_file(tmp_path):
    write(tmp_path, "parent", BASE + "memory:\n  mem_fraction_static: 2\n")
    write(tmp_path, "child", "extends: parent\nservice:\n  port: 8080\n")
    line = only_problem(tmp_path, "child")
    assert line.split(":")[0].endswith("parent.yaml") and "(line 6)" in line


def test_all_problems_are_reported_at_once(tmp_path):
    write(tmp_path, "p", BASE + "memory:\n  mem_fraction_static: 0\nservice:\n  port: -1\n  bogus: 1\n")
    assert len(problems_of(tmp_path, "p")) == 3


def test_unknown_profile_suggests_a_close_name(tmp_path):
    write(tmp_path, "cpu-ddtree", BASE)
    with pytest.raises(ProfileError) as caught:
        load_profile("cpu-ddtre", tmp_path)
    assert "did you mean 'cpu-ddtree'?" in caught.value.problems[0]


def test_null_in_a_child_resets_to_the_default(tmp_path):
    write(tmp_path, "parent", BASE + "cuda_graph:\n  max_bs: 8\n")
    write(tmp_path, "child", "extends: parent\ncuda_graph:\n  enabled: false\n  max_bs: null\n")
    assert load_profile("child", tmp_path).cuda_graph.max_bs is None


def test_a_loaded_profile_is_frozen(tmp_path):
    write(tmp_path, "p", BASE)
    profile = load_profile("p", tmp_path)
    with pytest.raises(Exception):
        profile.memory.context_length = 5


@pytest.mark.parametrize("section,key,value,reason", [
    # the injection: a newline in a path starts a unit line of its own
    ("service", "working_dir", '"/var/lib/ddops\\nExecStartPre=/bin/sh -c \'id > /tmp/pwned\'"',
     "contains a newline"),
    ("speculative", "draft_model_path", '"/models/m\\nExecStart=/bin/sh"', "contains a newline"),
    ("service", "environment", '{GREETING: "hi\\rthere"}', "control character U+000D"),
    ("service", "python", '"/opt/../bin/python"', "must be a normalized path"),
    ("service", "working_dir", '"/var/lib/ddops\\\\"', "must not end in a blank or a backslash"),
])
def test_values_that_would_become_unit_code_are_refused_naming_file_key_and_line(
        tmp_path, section, key, value, reason):
    write(tmp_path, "p", BASE + f"{section}:\n  {key}: {value}\n")
    line = only_problem(tmp_path, "p")
    assert f"p.yaml: {section}.{key}" in line and "(line 6)" in line and reason in line, line


def test_a_profile_file_name_that_would_reach_the_unit_header_is_refused(tmp_path):
    write(tmp_path, "bad name%", BASE)
    assert "may hold only letters, digits" in only_problem(tmp_path, "bad name%")
