"""The per-GPU arithmetic and its verdicts, on published model configs (tests/fit/configs)."""

from __future__ import annotations

import re
from dataclasses import replace

import pytest

from ddops.fit import Setup, assess, find_gpu, plan

A6000 = find_gpu("RTX A6000")
MIB = 1 << 20


def dense(gpu=A6000, **kw) -> Setup:
    base = dict(gpu=gpu, tp=1, fraction=0.85, context_length=32768, weights_dtype="bfloat16",
                kv_dtype="bfloat16", chunked_prefill_size=4096)
    return Setup(**{**base, **kw})


def balanced(**kw) -> Setup:
    """a6000-balanced's settings: DDTree budget 16 (17 verify tokens), 48 bf16 state slots."""
    base = dict(gpu=A6000, tp=2, fraction=0.85, context_length=8192, weights_dtype="bfloat16",
                kv_dtype="bfloat16", max_running_requests=8, chunked_prefill_size=4096, cuda_graphs=False,
                verify_tokens=17, mamba_slots=48, ssm_dtype="bfloat16", mamba_ratio=0.9,
                mamba_strategy="extra_buffer")
    return Setup(**{**base, **kw})


@pytest.mark.parametrize("fraction", [0.5, 0.7, 0.85, 0.9, 0.95, 0.99, 1.0])
def test_27b_bf16_does_not_fit_one_48gb_card_at_any_fraction(qwen27b, qwen27b_draft, fraction):
    result = assess(balanced(tp=1, fraction=fraction), qwen27b, qwen27b_draft)
    assert not result.verdict.fits
    assert len(result.verdict.reasons) == 1 and "weights alone need" in result.verdict.reasons[0]
    assert "no mem-fraction-static fits" in result.verdict.reasons[0]
    low, high = result.pools.window
    assert low > high  # no window at all
    assert any("model.tp_size 2 fits" in s for s in result.verdict.suggestions)


def test_27b_over_two_a6000_fits_with_the_hand_calculated_kv_pool(qwen27b, qwen27b_draft):
    result = assess(balanced(), qwen27b, qwen27b_draft)
    assert result.verdict.fits, result.verdict.reasons
    # docs/references.md, section "SGLang memory", by hand, per GPU:
    pre = 49140 * MIB - 512 * MIB                       # card minus CUDA context
    weights = (26_895_998_464 + 1_730_213_120) * 2 // 2  # bf16 target + draft params, split over 2
    rest = int(pre * 0.85) - weights
    table = (8 + 1) * (8192 + 8) * 4                     # req_to_token, int32
    slot = 48 * (48 // 2) * 128 * 128 * 2 + 48 * (10240 // 2) * 3 * 2  # bf16 SSM + conv, 48 GDN layers
    mamba = (48 + 1) * slot + slot * (8 + 1) * 17        # slots + per-verify-token states
    cell = 16 * (4 // 2) * (256 + 256) * 2 + 5 * (8 // 2) * (128 + 128) * 2  # target + draft KV
    assert cell == 43_008
    assert result.pools.kv_tokens == (rest - table - mamba) // cell
    assert result.pools.kv_tokens > 150_000
    assert result.pools.full_length_requests == 8


@pytest.mark.parametrize("model", ["llama8b", "qwen8b"])
def test_8b_dense_fits_one_a6000_at_085(request, model):
    facts = request.getfixturevalue(model)
    result = assess(dense(), facts)
    assert result.verdict.fits, result.verdict.reasons
    low, high = result.pools.window
    assert low < 0.85 <= high
    assert result.pools.kv_tokens > 32768


def test_8b_with_its_dflash_draft_counts_draft_weights_and_kv(qwen8b, qwen8b_draft):
    plain = plan(dense(), qwen8b)
    spec = plan(dense(verify_tokens=16, max_running_requests=8), qwen8b, qwen8b_draft)
    assert spec.draft_weights == qwen8b_draft.params * 2
    assert spec.draft_cell == 5 * 8 * 256 * 2  # 5 layers x 8 KV heads x (K + V) x bf16
    assert spec.cell == plain.cell + spec.draft_cell
    assert spec.kv_tokens < plain.kv_tokens


def test_fraction_above_the_window_names_the_headroom(llama8b):
    result = assess(dense(fraction=0.95), llama8b)
    assert not result.verdict.fits
    assert any("below the" in r and "CUDA out of memory" in r for r in result.verdict.reasons)


def test_fraction_below_the_weights_names_sglangs_startup_error(llama8b):
    result = assess(dense(fraction=0.3), llama8b)
    assert any("Loaded weights leave no GPU memory" in r for r in result.verdict.reasons)
    assert abs(result.pools.min_viable - 2 * 8_030_261_248 / (48628 * MIB)) < 1e-9


@pytest.mark.parametrize("fraction", [0.3, 0.95])
def test_the_suggested_fraction_fits(llama8b, fraction):
    verdict = assess(dense(fraction=fraction), llama8b).verdict
    picked = float(re.search(r"mem_fraction_static to ([0-9.]+)", verdict.suggestions[0]).group(1))
    assert assess(dense(fraction=picked), llama8b).verdict.fits


def test_a_context_too_long_for_the_pool_suggests_one_that_fits(llama8b):
    long = dense(context_length=262144)
    verdict = assess(long, llama8b).verdict
    assert any("fewer than one request" in r for r in verdict.reasons)
    advice = next(s for s in verdict.suggestions if "context_length" in s)
    context = int(re.search(r"context_length to ([0-9,]+)", advice).group(1).replace(",", ""))
    window_high = plan(long, llama8b).window[1]
    assert assess(replace(long, context_length=context, fraction=window_high), llama8b).verdict.fits


def test_fp8_kv_halves_the_cell_and_tp_splits_kv_heads_down_to_one(qwen27b):
    bf16 = plan(balanced(), qwen27b)
    fp8 = plan(balanced(kv_dtype="fp8_e4m3"), qwen27b)
    assert fp8.cell * 2 == bf16.cell
    tp8 = plan(balanced(tp=8), qwen27b)  # 4 KV heads over 8 GPUs: one (replicated) head each
    assert tp8.cell == 16 * 1 * 512 * 2


def test_unset_fraction_uses_sglangs_default_of_about_085_on_a_48gb_card(llama8b):
    pools = plan(dense(fraction=None), llama8b)
    assert pools.fraction_is_default and pools.fraction == pytest.approx(0.853, abs=0.001)
    assert pools.reserve / (1 << 30) == pytest.approx(7.08, abs=0.01)  # ~7.1 GiB (research 1.2)


def test_fp32_hybrid_state_with_many_requests_fails_on_the_hybrid_state(qwen27b, qwen27b_draft):
    """The first failed start: 16 requests x 33 verify tokens of float32 GDN state."""
    result = assess(balanced(fraction=0.84, cuda_graphs=True, graph_max_bs=16, context_length=32768,
                             max_running_requests=16, verify_tokens=33, mamba_slots=None, ssm_dtype=None,
                             mamba_strategy=None), qwen27b, qwen27b_draft)
    assert any("Not enough GPU memory for hybrid" in r for r in result.verdict.reasons)
    assert any("max_running_requests" in s for s in result.verdict.suggestions)


def test_a_card_given_by_memory_behaves_like_the_table_row(llama8b):
    from ddops.fit import gpu_from_gib
    assert plan(dense(gpu=gpu_from_gib(49140 / 1024)), llama8b).kv_tokens == plan(dense(), llama8b).kv_tokens


def test_chunking_off_reserves_for_a_whole_prefill(tmp_path, llama8b):
    from ddops.fit import Models, setup_for
    from ddops.fit.memory import reserve_bytes
    from ddops.profile import load_profile
    from tests.ops.helpers import write
    write(tmp_path, "p", "runtime: sglang\nmodel: {path: /m/llama, served_name: l}\n"
                         "memory: {chunked_prefill_size: -1}\n")
    setup = setup_for(load_profile("p", tmp_path), A6000, Models(llama8b, None))
    assert setup.chunked_prefill_size == 16384
    assert reserve_bytes(setup) - reserve_bytes(replace(setup, chunked_prefill_size=4096)) == int(1.5 * 12288) * MIB


def test_bundled_figures_of_the_27b_hybrid_count_kv_of_its_full_layers_and_its_linear_state(
        tmp_path, qwen27b, qwen27b_draft):
    """16 gated-attention layers keep K/V; 48 Gated DeltaNet layers keep (K-1) x 10240 conv
    values in bf16 and 48 x 128 x 128 fp32 recurrent values (the bundled runtime's layout).
    Served one sequence at a time, the draft's 5 layers keep context K/V for the same rows."""
    from ddops.fit import Models
    from ddops.fit.bundled import bundled_memory
    from ddops.profile import load_profile
    from tests.ops.helpers import write
    write(tmp_path, "p", "runtime: bundled\nmodel: {path: /m/q, served_name: q, dtype: bfloat16}\n"
                         "speculative: {algorithm: ddtree, draft_model_path: /m/d, ddtree_budget: 31}\n"
                         "memory: {context_length: 4096}\nservice: {device: cuda}\n")
    memory = bundled_memory(load_profile("p", tmp_path), Models(qwen27b, qwen27b_draft))
    assert memory.kv_slots == memory.draft_kv_slots == 4096 + 32
    assert memory.kv_cache_bytes == (16 * 2 * 4 * 256 + 5 * 2 * 8 * 128) * memory.kv_slots * 2
    assert memory.state_cache_bytes == 48 * (3 * 10240 * 2 + 48 * 128 * 128 * 4)   # one sequence's state
    assert memory.predicted_bytes == memory.weights_bytes + memory.kv_cache_bytes + memory.state_cache_bytes
    write(tmp_path, "plain", "runtime: bundled\nmodel: {path: /m/q, served_name: q, dtype: bfloat16}\n"
                             "memory: {context_length: 4096, max_running_requests: 6}\nservice: {device: cuda}\n")
    plain = bundled_memory(load_profile("plain", tmp_path), Models(qwen27b, None))
    # the batch runner: a state slot per running sequence, and a pool of 6 full sequences (fit
    # was given no card here, so no memory cap applies)
    assert plain.kv_slots == 6 * 4096 and plain.draft_kv_slots == 0
    assert plain.state_cache_bytes == 6 * memory.state_cache_bytes


def test_bundled_figures_take_the_pool_rows_from_max_total_tokens(tmp_path, qwen8b, qwen8b_draft):
    """The batch runner's K/V pool is 32 (the default running count) x (context + verify) rows,
    capped by --max-total-tokens when a profile passes it, and the draft pool beside it (the
    draft's 5 layers) as many rows."""
    from ddops.fit import Models
    from ddops.fit.bundled import bundled_memory
    from ddops.profile import load_profile
    from tests.ops.helpers import write
    base = ("runtime: bundled\nmodel: {path: /m/q, served_name: q, dtype: bfloat16}\n"
            "speculative: {algorithm: dflash, draft_model_path: /m/d}\nmemory: {context_length: 4096}\n"
            "service: {device: cuda}\n")
    write(tmp_path, "default", base)
    write(tmp_path, "capped", base + "sglang: {extra_args: [--max-total-tokens=20000]}\n")
    models = Models(qwen8b, qwen8b_draft)
    default = bundled_memory(load_profile("default", tmp_path), models)
    capped = bundled_memory(load_profile("capped", tmp_path), models)
    assert default.kv_slots == 32 * (4096 + 16) and capped.kv_slots == 20000
    assert default.draft_kv_slots == 32 * (4096 + 16) and capped.draft_kv_slots == 20000
    assert capped.kv_cache_bytes == (36 + 5) * 2 * 8 * 128 * 20000 * 2


def test_bundled_figures_count_no_prefix_store_with_disable_radix_cache(tmp_path, qwen8b, qwen8b_draft):
    """The prefix store (128 x 8 rows of Qwen3-8B's 36 layers' K/V plus 5 taps x 4096 features,
    bf16) is counted by default and not at all when sglang.extra_args passes the switch."""
    from ddops.fit import Models
    from ddops.fit.bundled import bundled_memory
    from ddops.profile import load_profile
    from tests.ops.helpers import write
    base = ("runtime: bundled\nmodel: {path: /m/q, served_name: q, dtype: bfloat16}\n"
            "speculative: {algorithm: dflash, draft_model_path: /m/d}\nmemory: {context_length: 4096}\n"
            "service: {device: cuda}\n")
    write(tmp_path, "default", base)
    write(tmp_path, "off", base + "sglang: {extra_args: [--disable-radix-cache]}\n")
    models = Models(qwen8b, qwen8b_draft)
    default = bundled_memory(load_profile("default", tmp_path), models)
    off = bundled_memory(load_profile("off", tmp_path), models)
    assert default.prefix_cache_bytes == 128 * 8 * (36 * 2 * 8 * 128 + qwen8b_draft.feature_width) * 2
    assert off.prefix_cache_bytes == 0
    assert off.predicted_bytes == default.predicted_bytes - default.prefix_cache_bytes


def test_a_bundled_fit_is_the_total_within_the_card_less_its_cuda_context(tmp_path, qwen8b, qwen8b_draft):
    """The decision `ddops fit` prints for the bundled runtime: predicted bytes against the card's
    memory less CUDA_CONTEXT. The pool rule takes 0.85 (the CUDA default fraction) of that memory
    less the weights and the prefix store, never less than one full sequence, so the smallest
    card that fits is the one that holds one sequence; a card one MiB short does not fit; no
    card (CPU) fits."""
    from ddops.fit import GpuKind, Models
    from ddops.fit.bundled import bundled_fit
    from ddops.fit.memory import CUDA_CONTEXT
    from ddops.profile import load_profile
    from tests.ops.helpers import write
    base = ("runtime: bundled\nmodel: {path: /m/q, served_name: q, dtype: bfloat16}\n"
            "speculative: {algorithm: dflash, draft_model_path: /m/d}\nmemory: {context_length: 4096}\n"
            "service: {device: cuda}\n")
    write(tmp_path, "p", base)
    write(tmp_path, "one", base + "sglang: {extra_args: [--max-total-tokens=4112]}\n")
    profile, models = load_profile("p", tmp_path), Models(qwen8b, qwen8b_draft)
    on_cpu = bundled_fit(profile, models, None)
    assert on_cpu.fits and on_cpu.usable_bytes is None
    one = bundled_fit(load_profile("one", tmp_path), models, None).memory.predicted_bytes
    smallest = -(-(one + CUDA_CONTEXT) // MIB)   # MiB of the smallest card that holds one sequence
    fits, short = (bundled_fit(profile, models, GpuKind("card", mib)) for mib in (smallest, smallest - 1))
    assert fits.fits and not short.fits and fits.memory.kv_slots == short.memory.kv_slots == 4112
    assert short.usable_bytes == (smallest - 1) * MIB - CUDA_CONTEXT < short.memory.predicted_bytes
    large = bundled_fit(profile, models, GpuKind("card", 40 * 1024))   # caps below 32 sequences
    m, row = large.memory, (36 + 5) * 2 * 8 * 128 * 2
    assert m.kv_slots == (int(0.85 * large.usable_bytes) - m.weights_bytes - m.prefix_cache_bytes) // row
    assert 4112 < m.kv_slots < 32 * 4112 and large.fits and m.pool.exact


def test_max_total_tokens_caps_the_sglang_pool_only_below_what_is_profiled(llama8b):
    """SGLang's pool is floor(rest / cell), then capped by --max-total-tokens;
    a cap above the profiled pool changes nothing (SGLang warns and keeps the profiled value)."""
    profiled = plan(dense(), llama8b)
    assert plan(dense(max_total_tokens=40_000), llama8b).kv_tokens == 40_000 < profiled.kv_tokens
    assert plan(dense(max_total_tokens=10 * profiled.kv_tokens), llama8b).kv_tokens == profiled.kv_tokens
    result = assess(dense(max_total_tokens=20_000), llama8b)
    assert not result.verdict.fits and result.pools.kv_tokens == 20_000
    assert "20,000 tokens (capped by --max-total-tokens), fewer than one request of context-length 32,768" \
        in result.verdict.reasons[0]
    assert result.pools.window[0] > result.pools.window[1]      # no fraction lifts the cap
    assert result.verdict.suggestions == ("raise --max-total-tokens in sglang.extra_args to at least 32,768, "
                                          "or lower memory.context_length to 20,000",)


def test_a_profile_passes_max_total_tokens_to_the_sglang_plan(tmp_path, llama8b):
    from ddops.fit import Models, setup_for
    from ddops.profile import load_profile
    from tests.ops.helpers import write
    write(tmp_path, "p", "runtime: sglang\nmodel: {path: /m/llama, served_name: l}\n"
                         "sglang: {extra_args: [--max-total-tokens, '40000']}\n")
    assert setup_for(load_profile("p", tmp_path), A6000, Models(llama8b, None)).max_total_tokens == 40_000
