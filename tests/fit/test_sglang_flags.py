"""SGLang's flags by version: each rename and removal, rendering in the declared spelling, and
validation naming a flag (or method) the declared version lacks."""

from __future__ import annotations

import pytest

from ddops.profile import load_profile
from ddops.profile.sglang_versions import RENAMES, VersionError, deprecations, flags_for, spell, unknown_flags
from ddops.render import render
from tests.ops.helpers import problems_of, write

SGLANG = """\
runtime: sglang
sglang_version: {version}
model: {{path: /m/Qwen3.6-27B, served_name: q, tp_size: 2}}
speculative: {{algorithm: {method}, draft_model_path: /m/Qwen3.6-27B-DFlash, block_size: 16{budget}}}
memory: {{mem_fraction_static: 0.85, context_length: 8192}}
cuda_graph: {{enabled: {graphs}{max_bs}}}
mamba: {{scheduler_strategy: extra_buffer}}
"""


def profile_text(version="0.5.23+ddtree", method="ddtree", budget=", ddtree_budget: 16", graphs="true",
                 max_bs=", max_bs: 8") -> str:
    return SGLANG.format(version=version, method=method, budget=budget, graphs=graphs, max_bs=max_bs)


def argv_of(tmp_path, **kw) -> list[str]:
    write(tmp_path, "p", profile_text(**kw))
    return render(load_profile("p", tmp_path)).argv


RENAMED = [("--cuda-graph-max-bs", "--cuda-graph-max-bs-decode"),
           ("--mamba-scheduler-strategy", "--mamba-radix-cache-strategy"),
           ("--speculative-dflash-draft-window-size", "--speculative-draft-window-size")]


@pytest.mark.parametrize("old,new", RENAMED)
def test_renamed_flag_is_a_deprecated_alias_in_0515_and_gone_in_0523(old, new):
    v15, v23 = flags_for("0.5.15"), flags_for("0.5.23")
    assert v15.accepts(old) and v15.accepts(new)
    assert deprecations(v15, [old]) == [f"{old} is deprecated since SGLang 0.5.15; use {new}"]
    assert not v23.accepts(old) and v23.accepts(new)
    assert unknown_flags(v23, [old]) == [f"{old} was removed in SGLang 0.5.23; use {new}"]
    assert spell(v15, [old, "8"]) == [new, "8"] and spell(v23, [old, "8"]) == [new, "8"]


def test_disable_cuda_graph_is_deprecated_but_still_accepted_in_both():
    for version in ("0.5.15", "0.5.23"):
        flags = flags_for(version)
        assert flags.accepts("--disable-cuda-graph") and not unknown_flags(flags, ["--disable-cuda-graph"])
        assert "deprecated" in deprecations(flags, ["--disable-cuda-graph"])[0]
        assert spell(flags, ["--disable-cuda-graph"]) == [
            "--cuda-graph-backend-decode", "disabled", "--cuda-graph-backend-prefill", "disabled"]


def test_every_rename_in_the_table_is_covered_here():
    assert {r.old for r in RENAMES} == {old for old, _ in RENAMED} | {"--disable-cuda-graph"}


def test_ddtree_flags_exist_only_with_the_pull_request():
    assert "DDTREE" not in flags_for("0.5.23").algorithms
    assert "DDTREE" in flags_for("0.5.23+ddtree").algorithms
    assert unknown_flags(flags_for("0.5.23"), ["--speculative-ddtree-budget"]) == [
        "--speculative-ddtree-budget is not in SGLang 0.5.23: needs a build with "
        "sgl-project/sglang PR #29907, declared as 0.5.23+ddtree"]
    assert flags_for("0.5.15+ddtree").accepts("--speculative-ddtree-budget")


def test_draft_kv_dtype_flag_is_new_in_0523():
    assert not flags_for("0.5.15").accepts("--speculative-draft-kv-cache-dtype")
    assert flags_for("0.5.23").accepts("--speculative-draft-kv-cache-dtype")


def test_an_untabulated_patch_release_uses_the_release_before_it():
    assert flags_for("0.5.19").release == "0.5.15" and flags_for("0.5.24").release == "0.5.23"
    with pytest.raises(VersionError, match="predates"):
        flags_for("0.5.10")
    with pytest.raises(VersionError, match="not a version"):
        flags_for("latest")


def test_rendering_uses_the_declared_versions_spelling(tmp_path):
    argv = argv_of(tmp_path)
    assert "--cuda-graph-max-bs-decode" in argv and "--cuda-graph-max-bs" not in argv
    assert argv[argv.index("--mamba-radix-cache-strategy") + 1] == "extra_buffer"
    assert "--mamba-scheduler-strategy" not in argv
    assert argv[argv.index("--speculative-ddtree-budget") + 1] == "16"


def test_graphs_off_renders_the_backend_flags_for_a_declared_version(tmp_path):
    argv = argv_of(tmp_path, graphs="false", max_bs="")
    assert "--disable-cuda-graph" not in argv
    assert argv[argv.index("--cuda-graph-backend-decode") + 1] == "disabled"
    assert argv[argv.index("--cuda-graph-backend-prefill") + 1] == "disabled"


def test_without_a_declared_version_the_table_spelling_stays(tmp_path):
    write(tmp_path, "p", profile_text().replace("sglang_version: 0.5.23+ddtree\n", ""))
    argv = render(load_profile("p", tmp_path)).argv
    assert "--cuda-graph-max-bs" in argv and "--mamba-scheduler-strategy" in argv


def test_validation_names_a_method_the_version_lacks(tmp_path):
    write(tmp_path, "p", profile_text(version="0.5.23"))
    problems = problems_of(tmp_path, "p")
    assert any("speculative.algorithm" in p and "SGLang 0.5.23 has no --speculative-algorithm DDTREE" in p
               for p in problems), problems
    assert any("speculative.ddtree_budget" in p and "PR #29907" in p for p in problems), problems


def test_dflash_on_a_release_validates(tmp_path):
    write(tmp_path, "p", profile_text(version="0.5.15", method="dflash", budget=""))
    assert load_profile("p", tmp_path).sglang_version == "0.5.15"


def test_a_bad_version_string_is_one_problem_naming_the_key(tmp_path):
    write(tmp_path, "p", profile_text(version="five"))
    problems = problems_of(tmp_path, "p")
    assert len(problems) == 1 and "sglang_version" in problems[0] and "not a version" in problems[0]
