"""Shape rules SGLang enforces (ddops.fit.shape), the KV dtypes 0.5.23 accepts, and the bounds of
the reported fraction window, through `ddops fit` and on the published configs."""

from __future__ import annotations

import json

from ddops.fit import facts_from_config
from ddops.fit.shape import bounded_window, kv_head_notes, tp_problems
from tests.fit.conftest import CONFIGS
from tests.fit.test_cli import fit
from tests.ops.helpers import write

def config(heads: int, kv: int | None) -> dict:
    c = {"hidden_size": heads * 64, "num_attention_heads": heads, "num_hidden_layers": 2,
         "vocab_size": 1000, "intermediate_size": 256, "max_position_embeddings": 4096}
    return c if kv is None else {**c, "num_key_value_heads": kv}

def test_tp_must_divide_target_and_draft_heads(qwen27b, qwen27b_draft):
    # Qwen3.6-27B: 24 query heads, 4 KV heads; its draft: 32 and 8
    assert tp_problems(qwen27b, qwen27b_draft, 2) == []
    target, draft = tp_problems(qwen27b, qwen27b_draft, 3)
    assert "target's num_key_value_heads=4" in target      # 24 heads split, 4 KV heads do not
    assert "draft's num_attention_heads=32" in draft
    assert "target's num_attention_heads=24" in tp_problems(qwen27b, None, 5)[0]

def test_the_kv_head_rule_both_ways():
    many = facts_from_config(config(24, 6), "m")          # 6 KV heads: tp 4 splits 6 unevenly
    assert "num_key_value_heads=6" in tp_problems(many, None, 4)[0]
    assert tp_problems(many, None, 2) == [] and tp_problems(many, None, 3) == []
    few = facts_from_config(config(24, 2), "f")           # fewer KV heads than ranks: replicated
    assert tp_problems(few, None, 8) == []
    odd = facts_from_config(config(24, 3), "o")
    assert "num_key_value_heads=3" in tp_problems(odd, None, 8)[0]   # 8 % 3 != 0

def test_a_config_without_kv_heads_is_read_as_multi_head_and_said_so():
    m = facts_from_config(config(16, None), "/m")
    assert m.attention.kv_heads == 16
    [note] = kv_head_notes(m, None)
    assert "no num_key_value_heads" in note and "num_attention_heads=16" in note
    assert kv_head_notes(facts_from_config(config(16, 4), "/n"), None) == []

def test_fit_rejects_a_tp_that_does_not_divide_the_heads():
    result = fit("a6000-base", "--gpu", "a6000", "--tp", "3", "--json")
    assert result.exit_code == 2, result.output
    error = " ".join(json.loads(result.stdout)["problems"])
    assert "tp 3 does not fit the target's num_key_value_heads=4" in error
    assert "tp 3 does not divide the draft's num_attention_heads=32" in error

def test_the_window_is_reported_inside_0_1_or_as_none():
    assert bounded_window(0.4, 0.85) == {"min": 0.4, "max": 0.85, "exists": True}
    assert bounded_window(1.7, 0.85)["exists"] is False and bounded_window(1.7, 0.85)["min"] is None
    assert bounded_window(0.0001, -0.2)["exists"] is False
    result = fit("a6000-base", "--gpu", "a6000", "--tp", "1", "--json")   # 27B on one card: none
    window = json.loads(result.stdout)["window"]
    assert window == {"min": None, "max": None, "exists": False}

def test_sglang_0_5_23_rejects_fp4_e2m1_and_names_its_replacement(tmp_path):
    write(tmp_path, "old-fp4", "extends: a6000-base\nmemory: {kv_cache_dtype: fp4_e2m1}\n")
    result = fit(str(tmp_path / "old-fp4.yaml"), "--gpu", "a6000", "--json")
    assert result.exit_code == 2, result.output
    error = " ".join(json.loads(result.stdout)["problems"])
    assert "'fp4_e2m1'" in error and "use 'fp4_mx_block16'" in error
    write(tmp_path, "new-fp4", "extends: a6000-base\nmemory: {kv_cache_dtype: fp4_mx_block16}\n")
    ok = fit(str(tmp_path / "new-fp4.yaml"), "--gpu", "a6000", "--json")
    assert ok.exit_code == 0, ok.output     # a6000-base fits; a 4-bit KV cache needs less than its own
    doc = json.loads(ok.stdout)
    assert doc["fits"] is True and doc["per_gpu_bytes"]["kv_per_token"] > 0

CONFIGS_USED = CONFIGS
