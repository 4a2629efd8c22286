"""Draft/target preflight on hybrids, from config files alone, on both sides (runtime and ddops).

The published Qwen3.6-27B (text under text_config, 64 layers of which 48 Gated DeltaNet) with its
DFlash draft (taps [1, 16, 31, 46, 61], 5 x 5120 = 25600 features) passes; a Qwen3-8B draft
(5 x 4096 = 20480, built for 36 layers) against it fails naming both widths.
"""

import subprocess
import sys
from pathlib import Path

import pytest

from ddops.draft_pairing import LocalFiles, check_pair, read_pair
from serving.contract.pairing import target_layer_ids, text_config
from serving.speculative import preflight

CONFIGS = Path(__file__).resolve().parents[1] / "fit" / "configs"
TARGET, DRAFT, SMALL_DRAFT = CONFIGS / "Qwen3.6-27B", CONFIGS / "Qwen3.6-27B-DFlash", CONFIGS / "Qwen3-8B-DFlash-b16"


def test_the_published_27b_pair_passes_in_the_runtime_and_in_ddops():
    draft, target = preflight.read_config(DRAFT), preflight.read_config(TARGET)
    assert "hidden_size" not in target and text_config(target)["hidden_size"] == 5120
    assert target_layer_ids(draft) == [1, 16, 31, 46, 61]
    assert preflight.problems(draft, target) == []
    assert preflight.problems(draft, target, block_size=16, budget=63) == []
    assert check_pair(read_pair(LocalFiles(), str(TARGET), str(DRAFT))) == []


def test_an_8b_draft_on_the_27b_hybrid_fails_naming_both_widths():
    found = preflight.problems(preflight.read_config(SMALL_DRAFT), preflight.read_config(TARGET))
    assert any("20480" in p and "25600" in p for p in found), found
    assert any("36-layer" in p and "64 layers" in p for p in found), found
    ops = check_pair(read_pair(LocalFiles(), str(TARGET), str(SMALL_DRAFT)))
    widths = [p for p in ops if "20480" in p.reason and "25600" in p.reason]
    assert widths and str(SMALL_DRAFT) in widths[0].reason and str(TARGET) in widths[0].reason


@pytest.mark.parametrize("draft, code", [(DRAFT, 0), (SMALL_DRAFT, 1)])
def test_the_preflight_command_reads_nested_target_configs(draft, code):
    done = subprocess.run([sys.executable, "-m", "serving.speculative.preflight", str(draft), str(TARGET)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == code, done.stdout + done.stderr
    if code:
        assert "20480" in done.stderr and "25600" in done.stderr


def test_a_tap_past_the_hybrid_is_refused():
    draft = dict(preflight.read_config(DRAFT), dflash_config={"mask_token_id": 248070,
                                                             "target_layer_ids": [1, 16, 31, 46, 64]})
    found = preflight.problems(draft, preflight.read_config(TARGET))
    assert any("layers 0..63" in p and "[64] missing" in p for p in found), found
