"""Config-only preflight: every mismatch is named with both sides; the CLI needs no torch."""

import json
import subprocess
import sys

import pytest

from serving.speculative.preflight import PreflightError, check, derived_layer_ids, problems

TARGET_27B = {"hidden_size": 5120, "num_hidden_layers": 64, "vocab_size": 248320}
DRAFT_27B = {"hidden_size": 5120, "num_hidden_layers": 5, "num_target_layers": 64, "vocab_size": 248320,
             "block_size": 16, "dflash_config": {"mask_token_id": 248070, "target_layer_ids": [1, 16, 31, 46, 61]}}


def test_released_pair_is_compatible():
    assert problems(DRAFT_27B, TARGET_27B, block_size=16, budget=64) == []


def test_width_mismatch_names_both_sides():
    target = dict(TARGET_27B, hidden_size=4096)
    found = problems(DRAFT_27B, target)
    assert "draft expects 25600 = 5 layers x 5120 but the target provides 5 x 4096 = 20480" in found


def test_fc_weight_width_is_checked_when_known():
    found = problems(DRAFT_27B, TARGET_27B, fc_in=5120)  # the SGLang DDTREE bug: [N, 5120] not 25600
    assert found == ["draft expects 5120 = 5 layers x 1024 but the target provides 5 x 5120 = 25600"]


@pytest.mark.parametrize("change, fragment", [
    ({"num_hidden_layers": 36}, "draft taps target layers [1, 16, 31, 46, 61] but the target has layers 0..35"),
    ({"num_hidden_layers": 36}, "draft was built for a 64-layer target but the target has 36 layers"),
    ({"vocab_size": 151936}, "draft mask_token_id 248070 does not fit the target vocabulary of 151936"),
    ({"vocab_size": 151936}, "draft vocab_size 248320 but the target vocab_size is 151936"),
])
def test_target_side_mismatches(change, fragment):
    assert any(fragment in p for p in problems(DRAFT_27B, dict(TARGET_27B, **change)))


def test_block_and_budget_consistency():
    assert problems(DRAFT_27B, TARGET_27B, block_size=32) == [
        "block size 32 is larger than the draft's trained block_size 16"]
    assert problems(DRAFT_27B, TARGET_27B, block_size=1) == ["block size 1 leaves no draft tokens (needs >= 2)"]
    assert problems(DRAFT_27B, TARGET_27B, budget=0) == ["ddtree budget 0 must be >= 1"]


def test_missing_keys_are_named():
    draft = {k: v for k, v in DRAFT_27B.items() if k != "dflash_config"}
    assert "draft dflash_config.mask_token_id is missing" in problems(draft, TARGET_27B)
    assert problems(DRAFT_27B, {"hidden_size": 1}) == ["target num_hidden_layers is missing from config.json",
                                                         "target vocab_size is missing from config.json"]


def test_layer_ids_derive_as_the_reference_does():
    assert derived_layer_ids(64, 5) == [1, 16, 31, 46, 61]
    assert derived_layer_ids(36, 5) == [1, 9, 17, 25, 33]
    assert derived_layer_ids(30, 1) == [15]


def test_check_raises_one_line_with_every_problem():
    with pytest.raises(PreflightError) as err:
        check(DRAFT_27B, dict(TARGET_27B, hidden_size=4096, vocab_size=1000))
    assert "\n" not in str(err.value) and "25600" in str(err.value) and "1000" in str(err.value)


def test_command_line_runs_without_torch(tmp_path):
    (tmp_path / "draft").mkdir()
    (tmp_path / "target").mkdir()
    (tmp_path / "draft/config.json").write_text(json.dumps(DRAFT_27B))
    (tmp_path / "target/config.json").write_text(json.dumps(dict(TARGET_27B, hidden_size=4096)))
    # torch import is poisoned: the preflight path must not need it
    code = ("import sys; sys.modules['torch'] = None; from serving.speculative.preflight import main; "
            f"sys.exit(main([{str(tmp_path / 'draft')!r}, {str(tmp_path / 'target')!r}]))")
    bad = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert bad.returncode == 1 and "draft expects 25600 = 5 layers x 5120" in bad.stderr
    (tmp_path / "target/config.json").write_text(json.dumps(TARGET_27B))
    good = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert good.returncode == 0, good.stderr
