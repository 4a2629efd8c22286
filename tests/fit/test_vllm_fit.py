"""vLLM's memory model (ddops/fit/vllm_memory.py): the arithmetic from tables, the refusal in
vLLM's words, the shipped vLLM profiles, and `ddops fit`'s exit codes for them."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ddops.cli import app
from ddops.fit import find_gpu, local_reader, read_models
from ddops.fit.memory_models import predict
from ddops.fit.vllm_fit import assess, setup_for
from ddops.fit.vllm_memory import VllmSetup, capture_sizes, group_size, kv_buckets, plan, state_page_bytes
from ddops.profile import load_profile
from tests.fit.conftest import CONFIGS, facts

REPO = Path(__file__).resolve().parents[2]
PROFILES = REPO / "profiles"
A6000 = find_gpu("a6000")
runner = CliRunner()


def gpu_setup(**changes) -> VllmSetup:
    base = VllmSetup(device="cuda", gpu=A6000, tp=2, utilization=0.9, utilization_is_default=False,
                     max_model_len=32768, max_num_seqs=4, batched_tokens=4096, weights_dtype="bfloat16",
                     kv_dtype="bfloat16", speculative_tokens=15, max_capture=4)
    return replace(base, **changes)


# (model, tp, K, kv dtype) -> (block size, page bytes): the page is block x K/V bytes of a token;
# a hybrid's block grows (by 16s) until its page holds one Gated DeltaNet state.
@pytest.mark.parametrize("model, tp, k, kv, block, page", [
    ("Qwen3-8B", 1, 0, "bfloat16", 16, 16 * 8 * 256 * 2),
    ("Qwen3-8B", 2, 0, "fp8_e4m3", 16, 16 * 4 * 256 * 1),
    ("Llama-3.1-8B-Instruct", 8, 0, "bfloat16", 16, 16 * 1 * 256 * 2),
    # state: conv 5120 x (3 + K) bf16 + recurrent 24 x 128 x 128 fp32 = 1,757,184 B at K=15
    ("Qwen3.6-27B", 2, 15, "bfloat16", 864, 864 * 2 * 512 * 2),
    # K=0: 5120 x 3 x 2 + 1,572,864 = 1,603,584 B -> 49 x 32 KiB -> 784 tokens
    ("Qwen3.6-27B", 2, 0, "bfloat16", 784, 784 * 2 * 512 * 2),
])
def test_block_and_page_sizes(model, tp, k, kv, block, page):
    s = gpu_setup(tp=tp, speculative_tokens=k, kv_dtype=kv)
    got_block, buckets = kv_buckets(s, facts(model), None)
    assert (got_block, buckets[0].page) == (block, page)
    assert all(b.page == page for b in buckets)


def test_gated_deltanet_state_page():
    assert state_page_bytes(facts("Qwen3.6-27B"), gpu_setup()) == 5120 * 18 * 2 + 24 * 128 * 128 * 4


def test_hybrid_state_pages_per_request_follow_prefix_caching():
    target = facts("Qwen3.6-27B")
    with_cache = kv_buckets(gpu_setup(), target, None)[1][-1]
    without = kv_buckets(gpu_setup(prefix_caching=False), target, None)[1][-1]
    assert (with_cache.kind, with_cache.per_request, without.per_request) == ("linear-attention state", 17, 16)


@pytest.mark.parametrize("layers, expected", [((16, 48), 16), ((16, 5, 48), 5), ((13, 12), 13), ((30,), 30)])
def test_group_size_rule(layers, expected):
    from ddops.fit.vllm_memory import Bucket
    assert group_size(tuple(Bucket("x", n, 1, 1, 1) for n in layers)) == expected


@pytest.mark.parametrize("max_capture, seqs, k, sizes", [
    (4, 4, 15, [1, 2, 4]), (None, 4, 0, [1, 2, 4, 8]), (None, 256, 0, None)])
def test_capture_sizes(max_capture, seqs, k, sizes):
    got = capture_sizes(gpu_setup(max_capture=max_capture, max_num_seqs=seqs, speculative_tokens=k))
    if sizes is None:  # 2 x 256 = 512: the default list up to 512
        assert got[:4] == [1, 2, 4, 8] and got[-1] == 512 and len(got) == 3 + 31 + 17
    else:
        assert got == sizes


def test_budget_is_utilization_less_weights_and_estimates():
    target = facts("Qwen3-8B")
    p = plan(gpu_setup(tp=1, speculative_tokens=0), target)
    assert p.requested == -(-A6000.memory_bytes * 9 // 10)
    assert p.available == p.requested - p.target_weights - p.non_torch - p.activation - p.cuda_graphs
    assert p.num_blocks == p.available // p.bytes_per_block
    assert p.bytes_per_block == 36 * p.buckets[0].page  # one group of every layer
    assert p.blocks_per_request == 2048 and p.kv_tokens == int(p.num_blocks / 2048 * 32768)


def test_eager_has_no_graph_estimate():
    p = plan(gpu_setup(cuda_graphs=False), facts("Qwen3.6-27B"), facts("Qwen3.6-27B-DFlash"))
    assert p.cuda_graphs == 0 and plan(gpu_setup(), facts("Qwen3.6-27B")).cuda_graphs > 0


def test_refusal_when_one_request_does_not_fit_in_vllms_words():
    s = gpu_setup(tp=1, max_model_len=262144, speculative_tokens=0, utilization=0.95)
    a = assess(s, facts("Qwen3-8B"))
    assert not a.verdict.fits and not a.one_request_fits
    reason = a.verdict.reasons[0]
    assert "To serve at least one request with the model's max seq len (262144)" in reason
    assert "larger than the available KV cache memory" in reason
    assert f"estimated maximum model length is {a.plan.longest_len:,}" in reason
    assert any("--max-model-len" in idea for idea in a.verdict.suggestions)


def test_utilization_above_free_memory_is_refused():
    a = assess(gpu_setup(tp=1, utilization=1.0, speculative_tokens=0), facts("Qwen3-8B"))
    assert "less than desired GPU memory utilization" in a.verdict.reasons[0]


def test_cpu_kv_space_sizes_the_cache_and_refuses_too_small():
    target = facts("Qwen3-8B")
    cpu = replace(gpu_setup(), device="cpu", gpu=None, tp=1, speculative_tokens=0, cuda_graphs=False,
                  cpu_kv_bytes=4 << 30, max_model_len=8192)
    p = plan(cpu, target)
    assert (p.available, p.block_size, p.weights) == (4 << 30, 128, p.target_weights)
    assert p.needed == 36 * 64 * 128 * 8 * 256 * 2  # 8192 rows of K/V, every layer
    small = assess(replace(cpu, cpu_kv_bytes=1 << 30), target)
    assert not small.verdict.fits and "VLLM_CPU_KVCACHE_SPACE=1" in small.verdict.reasons[0]
    assert "No available memory" in assess(replace(cpu, cpu_kv_bytes=0), target).verdict.reasons[0]


@pytest.mark.parametrize("name", ["cpu-smollm2-vllm", "cpu-smollm2-vllm-dflash"])
def test_shipped_cpu_profiles_fit_their_kv_space(name):
    profile = load_profile(name, PROFILES)
    result = predict(profile, None, read_models(profile, local_reader(CONFIGS))).assessment
    assert result.verdict.fits and result.one_request_fits
    assert result.plan.available == 1 << 30  # VLLM_CPU_KVCACHE_SPACE: "1"
    # SmolLM2-135M in fp32: 3 KV heads x (64 + 64) x 4 B = 1,536 B a token and layer, 46,080 B
    # over its 30 layers: 1 GiB holds 23,301 rows
    assert result.plan.buckets[0].page == 128 * 1536
    assert result.plan.kv_tokens <= (1 << 30) // 46080


def test_shipped_a6000_profile_reads_its_flags():
    profile = load_profile("a6000-vllm", PROFILES)
    models = read_models(profile, local_reader(CONFIGS))
    s = setup_for(profile, A6000, models.target, models.draft)
    assert (s.utilization, s.max_model_len, s.batched_tokens, s.speculative_tokens) == (0.9, 32768, 4096, 15)
    a = predict(profile, A6000, models).assessment
    assert a.verdict.fits and a.plan.block_size == 864 and a.full_length_requests == 4


def fit(*args: str):
    return runner.invoke(app, ["fit", *args], env={"DDOPS_PROFILES": str(PROFILES), "DDOPS_FIT_MODELS": str(CONFIGS)})


def test_fit_command_for_the_shipped_vllm_profile():
    result = fit("a6000-vllm", "--gpu", "a6000", "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["fits"] and doc["block_size"] == 864 and doc["max_concurrency"] >= 4
    assert set(doc["estimated"]) == {"activation_peak", "non_torch", "cuda_graphs"}
    text = fit("a6000-vllm", "--gpu", "a6000")
    assert "activation peak at 4,096 tokens (estimate)" in text.stdout


def test_fit_command_exits_1_for_a_predicted_misfit():
    result = fit("a6000-vllm", "--gpu", "a6000", "--tp", "1")
    assert result.exit_code == 1
    assert "weights alone need" in result.stdout and "model.tp_size 2 fits" in result.stdout
