"""The search space comes from the runtime table and the methods' capabilities: a key the
candidate's method cannot use is never a candidate of its own, and a space file is checked
like a profile (file, key, reason) before anything is planned."""

from __future__ import annotations

import pytest

from ddops.profile import load_profile
from ddops.profile.runtimes import RUNTIMES
from ddops.tune import space as spaces
from ddops.tune.measure import Level, Requirements, geomean, parse_slo, ratio
from ddops.exits import BadInput


def test_the_default_space_is_the_runtime_table_s_tunable_keys():
    ddtree = load_profile("cpu-ddtree")
    space = spaces.default_space(ddtree)
    tunable = {f.key: f.tune for f in RUNTIMES["bundled"].flags if f.tune}
    assert space.keys == tunable and list(space.keys)[0] == spaces.METHOD_KEY
    # a profile with no draft model tries plain decoding only
    plain = spaces.default_space(load_profile("cpu-ar"))
    assert plain.keys[spaces.METHOD_KEY] == ("none",)


def test_keys_a_method_cannot_use_make_no_candidates_of_their_own():
    ddtree = load_profile("cpu-ddtree")
    space = spaces.Space({"speculative.algorithm": ("none", "dflash", "ddtree"),
                          "speculative.ddtree_budget": (8, 16), "speculative.adaptive": (True, False)})
    found = spaces.candidates(space, ddtree)
    # none: 1 (draft and budget unset), dflash: 2 (adaptive; budget unset), ddtree: 2 x 2
    assert len(found) == 1 + 2 + 4
    plain = found[0]
    assert plain == {"speculative.algorithm": "none", "speculative.draft_model_path": None,
                     "speculative.ddtree_budget": None}
    assert all("speculative.ddtree_budget" not in c or c["speculative.ddtree_budget"] is None
               for c in found if c["speculative.algorithm"] == "dflash")
    assert len({spaces.candidate_id(c) for c in found}) == len(found)


def test_a_candidate_file_extends_the_base_and_loads_as_a_profile(tmp_path):
    from ddops.tune.plan import write_profile
    chosen = {"speculative.algorithm": "dflash", "speculative.ddtree_budget": None, "speculative.adaptive": False}
    path = write_profile(tmp_path / "cpu-ddtree-tune-x.yaml", "cpu-ddtree", chosen, ["a comment"])
    assert path.read_text().startswith("# a comment\nextends: cpu-ddtree\n")
    loaded = load_profile(str(path))
    assert (loaded.speculative.algorithm, loaded.speculative.ddtree_budget, loaded.speculative.adaptive) == \
        ("dflash", None, False)
    from ddops.render import render
    assert "--speculative-adaptive" in render(loaded).argv and "--speculative-ddtree-budget" not in render(loaded).argv


def test_a_space_file_narrows_the_space_and_names_file_key_and_reason(tmp_path):
    ddtree = load_profile("cpu-ddtree")
    good = tmp_path / "space.yaml"
    good.write_text("speculative.ddtree_budget: [8, 16]\nspeculative.adaptive: []\n")
    space = spaces.load_space(good, ddtree)
    assert space.keys["speculative.ddtree_budget"] == (8, 16) and "speculative.adaptive" not in space.keys
    bad = tmp_path / "bad.yaml"
    bad.write_text("memory.chunked_prefill_size: [2048]\nspeculative.ddtree_budget: 8\n")
    with pytest.raises(spaces.SpaceError) as err:
        spaces.load_space(bad, ddtree)
    text = "\n".join(err.value.problems)
    assert "bad.yaml: memory.chunked_prefill_size (line 1): runtime bundled has no flag" in text
    assert "bad.yaml: speculative.ddtree_budget (line 2): must be a list of values" in text


def test_the_objective_is_a_multiple_of_production_and_a_requirement_fails_it():
    prod = Level(4, 8, 0, 100.0, 0.1, 0.2, 0.02, 0.03)
    fast = Level(4, 8, 0, 150.0, 0.1, 0.2, 0.01, 0.02, token_equality=1.0)
    assert ratio(fast, prod, "throughput") == 1.5 and ratio(fast, prod, "latency") == 2.0
    assert geomean([1.5, 2 / 3]) == pytest.approx(1.0) and geomean([1.5, None]) == 0.0
    wrong = Level(4, 8, 1, 150.0, 0.1, 0.9, 0.01, 0.02, token_equality=0.9)
    unmet = Requirements(1.0, **parse_slo("ttft_p99_ms=500")).unmet([wrong])
    assert unmet == ["1 of 8 requests failed at concurrency 4",
                     "token equality with production 0.900 < 1.0 at concurrency 4",
                     "TTFT p99 900 ms > SLO 500 ms at concurrency 4"]
    with pytest.raises(BadInput, match="unknown bound 'p99'"):
        parse_slo("p99=3")
