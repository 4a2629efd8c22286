"""Which dtype the bundled runtime loads a target in, and what it computes in: one rule
(serving.contract.runtime) that the runtime's --dtype auto and ddops fit both follow."""

from dataclasses import replace
from pathlib import Path

from ddops.fit import Models
from ddops.fit.bundled import bundled_memory
from ddops.profile import load_profile
from serving.config import parse_args, resolve
from serving.contract.runtime import auto_dtype, compute_dtype, cpu_flags, native_bf16
from serving.contract.sizes import kv_bytes
from serving.models.config import read_model_config
from serving.tools.tiny import write_tiny
from tests.ops.helpers import write

CPUINFO = "processor\t: 0\nvendor_id\t: AuthenticAMD\nflags\t\t: fpu sse avx512f avx512_bf16 avx512_vnni\nbugs\t\t: x\n"


def test_auto_is_the_checkpoint_on_cuda_and_bf16_on_cpu_only_where_the_cpu_multiplies_it():
    flags = cpu_flags(CPUINFO)
    assert "avx512_bf16" in flags and native_bf16(flags) and not native_bf16(frozenset({"avx512f"}))
    assert native_bf16(frozenset({"amx_bf16"})) and cpu_flags(None) == cpu_flags("no flags here") == frozenset()
    assert auto_dtype("cuda", "bfloat16", frozenset()) == "bfloat16"
    assert auto_dtype("cuda", "float16", flags) == "float16"
    assert auto_dtype("cpu", "bfloat16", flags) == "bfloat16"
    assert auto_dtype("cpu", "bfloat16", frozenset({"avx512f"})) == "float32"    # emulated bf16: slower
    assert auto_dtype("cpu", "float16", flags) == "float32"                      # no fp16 products on CPU
    assert auto_dtype("cpu", "float32", flags) == "float32"                      # never rounded unasked
    assert compute_dtype("cpu", "bfloat16", hybrid=False) == "float32"
    assert compute_dtype("cpu", "bfloat16", hybrid=True) == compute_dtype("cuda", "bfloat16", False) == "bfloat16"


def test_the_runtime_resolves_auto_from_this_hosts_flags(tmp_path):
    path = write_tiny(tmp_path / "bf16", arch="llama", dtype="bfloat16")
    args = resolve(parse_args(["--model-path", str(path)], environ={}), read_model_config(path), cuda_available=False)
    host = cpu_flags(Path("/proc/cpuinfo").read_text())
    assert args.dtype == ("bfloat16" if native_bf16(host) else "float32")


def test_fit_counts_the_dtype_the_host_would_run(tmp_path, qwen8b, qwen8b_draft):
    """A bf16 checkpoint under dtype auto on a CPU host: with the host's flags read, bf16 weights
    and target K/V rows and the drafter's projection matrices, and the rest of the drafter, its K/V and
    the prefix rows' features in fp32 (what the runtime allocates there); without them, float32 throughout, the larger of the two, so a fit
    that did not read the host never under-counts."""
    write(tmp_path, "p", "runtime: bundled\nmodel: {path: /m/q, served_name: q, dtype: auto}\n"
                         "speculative: {algorithm: dflash, draft_model_path: /m/d}\n"
                         "memory: {context_length: 4096, max_running_requests: 2}\nservice: {device: cpu}\n")
    profile, models = load_profile("p", tmp_path), Models(replace(qwen8b, dtype="bfloat16"), qwen8b_draft)
    read = bundled_memory(profile, models, device="cpu", cpu_flags=cpu_flags(CPUINFO))
    unread = bundled_memory(profile, models, device="cpu")
    assert (read.dtype, unread.dtype) == ("bfloat16", "float32")
    target, draft_kv = qwen8b.attention, qwen8b_draft.attention

    def rows(a, count, width):
        return kv_bytes(a.layers, a.kv_heads, a.head_dim, count, width, a.v_head_dim)
    assert read.kv_slots == unread.kv_slots and read.draft_kv_slots == unread.draft_kv_slots
    assert read.kv_cache_bytes == rows(target, read.kv_slots, 2) + rows(draft_kv, read.draft_kv_slots, 4)
    assert unread.kv_cache_bytes == rows(target, read.kv_slots, 4) + rows(draft_kv, read.draft_kv_slots, 4)
    features = qwen8b_draft.feature_width * 4
    assert read.prefix_cache_bytes == 128 * 8 * (rows(target, 1, 2) + features)
    assert unread.prefix_cache_bytes == 128 * 8 * (rows(target, 1, 4) + features)
    draft = qwen8b_draft.weight_bytes("float32")
    projections = qwen8b_draft.projection_params
    assert 0 < projections < qwen8b_draft.params
    bf16_draft = draft - 2 * projections                     # its projection matrices in bf16, the rest fp32
    assert unread.weights_bytes - draft == 2 * (read.weights_bytes - bf16_draft)   # target and head copy halve
