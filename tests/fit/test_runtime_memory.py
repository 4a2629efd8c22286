"""Prediction vs measurement on CPU: the ops planner's allocation model of the bundled runtime
against what a real `python -m serving` process reports under /server_info `memory`.

Tolerance: 1% of each measured figure. Both sides count every parameter in the runtime dtype
and the K/V preallocated for the server's life (the target's, and the draft's as many rows
with a speculative method) and a dense target's prefix store, so they agree exactly today; the margin only absorbs a buffer the runtime
may add later (rope tables, say) without hiding a wrong formula (a missed layer or a GQA slip is
10% or more on these models). ddops fit's figures and the runtime's own prediction are one
model and must be equal, byte for byte.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import httpx
import pytest

from ddops.fit import local_reader, read_models
from ddops.fit.bundled import bundled_fit
from ddops.profile import load_profile
from serving.device_memory import device_memory
from serving.tools.tiny_draft import write_tiny_draft
from tests.server_process import THREADS, ServerProcess

TOLERANCE = 0.01


SHARE = "a memory share that holds 4.5 sequences"
# (arch, dtype, speculative section of the profile, sglang.extra_args, (target, draft) K/V rows):
# the batch runner's pool by the start-up rule, 32 running sequences (the default) x the context
# (384) plainly, x (384 + 12) rows with a tree method (the 11-node tree and its root, wider than
# the 8-token block), the draft pool beside it as many; a speculative hybrid's one-sequence caches
# of 396; --max-total-tokens caps the pool; --disable-radix-cache leaves no prefix store; SHARE: a
# --mem-fraction-static of this machine's memory chosen so the rule's memory cap binds.
CASES = [("llama", "float32", None, [], SHARE), ("qwen3", "bfloat16", None, [], (32 * 384, 0)),
         ("qwen3_5", "bfloat16", None, [], (32 * 384, 0)),
         ("qwen3_5", "bfloat16", "{algorithm: ddtree, ddtree_budget: 11}", [], (396, 396)),
         ("qwen3", "bfloat16", "{algorithm: ddtree, ddtree_budget: 11}", [], (32 * 396, 32 * 396)),
         ("llama", "float32", "{algorithm: dflash}", ["--max-total-tokens", "500"], (500, 500)),
         ("llama", "float32", "{algorithm: ddtree, ddtree_budget: 11}", ["--disable-radix-cache"],
          (32 * 396, 32 * 396))]


@pytest.fixture(scope="module", params=CASES, ids=lambda c: "-".join(filter(None, (c[0], c[2] and "spec", *c[3]))))
def served(request, tmp_path_factory):
    """A tiny checkpoint from the project's tool (and a draft for it), a bundled profile for
    them, a real server started with the profile's memory and speculative flags."""
    arch, dtype, speculative, extra, rows = request.param
    root = tmp_path_factory.mktemp(f"fit-{arch}")
    model = root / f"tiny-{arch}"
    subprocess.run([sys.executable, "-m", "serving.tools.tiny", "--arch", arch, "--out", str(model),
                    "--dtype", dtype, "--shards", "2" if arch == "qwen3" else "1"],
                   check=True, capture_output=True, env={**os.environ, **THREADS})
    flags = ["--dtype", dtype, "--context-length", "384", *extra]
    lines = [f"model: {{path: {model}, served_name: tiny, dtype: {dtype}}}"]
    if speculative:
        draft = write_tiny_draft(model, root / "draft", seed=1)
        lines.append(f"speculative: {speculative[:-1]}, draft_model_path: {draft}}}")
        spec = load_profile_text(root, lines).speculative
        flags += ["--speculative-algorithm", spec.algorithm, "--speculative-draft-model-path", str(draft)]
        flags += ["--speculative-ddtree-budget", str(spec.ddtree_budget)] if spec.ddtree_budget else []
    if extra:
        lines.append(f"sglang: {{extra_args: {json.dumps(extra)}}}")
    profile = load_profile_text(root, lines)
    if rows == SHARE:
        fraction, rows = _binding_share(profile)
        profile = load_profile_text(root, lines, f", mem_fraction_static: {fraction}")
        flags += ["--mem-fraction-static", fraction]
    server = ServerProcess(model, root / "server.log", *flags)
    try:
        server.wait_ready()
        yield profile, server.url, rows
    finally:
        server.stop()


def load_profile_text(root, lines: list[str], memory: str = ""):
    (root / "p.yaml").write_text("\n".join(["runtime: bundled", *lines, f"memory: {{context_length: 384{memory}}}",
                                            "service: {device: cpu}", ""]))
    return load_profile(str(root / "p.yaml"))


def host_fit(profile):
    """ddops fit's figures from this host's facts (the server runs here, in this cgroup)."""
    return bundled_fit(profile, read_models(profile, local_reader()), None, device_memory("cpu")).memory


def _binding_share(profile) -> tuple[str, tuple[int, int]]:
    """A fraction of this host's memory that leaves the pool room for 4.5 sequences after the
    weights and the prefix store, and the rows that gives: more than one sequence, fewer than 32."""
    plain, host = host_fit(profile), device_memory("cpu")
    row = plain.kv_cache_bytes // plain.kv_slots
    fixed = plain.weights_bytes + plain.prefix_cache_bytes
    fraction = f"{(fixed + 4.5 * 384 * row) / host:.6g}"
    rows = (int(float(fraction) * host) - fixed) // row
    assert 4 * 384 < rows < 5 * 384
    return fraction, (rows, 0)


def _close(predicted: int, measured: int) -> bool:
    return abs(predicted - measured) <= TOLERANCE * measured


def test_ops_prediction_matches_the_runtime_measurement(served):
    profile, url, _ = served
    memory = httpx.get(url + "/server_info", timeout=10).json()["memory"]
    ops = host_fit(profile)
    assert memory["weights_bytes"] > 0 and memory["kv_cache_bytes"] > 0
    assert _close(ops.weights_bytes, memory["weights_bytes"]), (ops, memory)
    assert _close(ops.kv_cache_bytes, memory["kv_cache_bytes"]), (ops, memory)
    assert ops.state_cache_bytes == memory["state_cache_bytes"], (ops, memory)   # 0 unless hybrid
    assert ops.prefix_cache_bytes == memory["prefix_cache_bytes"], (ops, memory)   # 0 if hybrid
    assert _close(ops.predicted_bytes, memory["measured_bytes"])


def test_ops_figures_equal_the_runtimes_own_prediction(served):
    """One allocation model on both sides: ddops fit's bundled figures are the runtime's
    prediction, byte for byte (K/V: the target's and, with a speculative method, the draft's;
    the prefix store)."""
    profile, url, _ = served
    memory = httpx.get(url + "/server_info", timeout=10).json()["memory"]
    ops = host_fit(profile)
    assert ops.kv_cache_bytes == memory["predicted_kv_cache_bytes"] == memory["kv_cache_bytes"], (ops, memory)
    assert ops.state_cache_bytes == memory["predicted_state_cache_bytes"], (ops, memory)
    assert ops.prefix_cache_bytes == memory["predicted_prefix_cache_bytes"], (ops, memory)


def test_server_info_reports_the_pool_the_start_up_rule_resolved(served):
    """The rows the runner allocated are the resolved --max-total-tokens /server_info reports
    (None for a target served one sequence at a time, which has no pool to size), and ddops
    fit, from this host's memory, predicts the same rows."""
    profile, url, (target_rows, draft_rows) = served
    info = httpx.get(url + "/server_info", timeout=10).json()
    one_at_a_time = profile.method.is_speculative and read_models(profile, local_reader()).target.linear
    assert info["max_total_tokens"] == (None if one_at_a_time else target_rows)
    ops = host_fit(profile)
    assert (ops.kv_slots, ops.draft_kv_slots) == (target_rows, draft_rows)
    assert ops.pool is None if one_at_a_time else ops.pool.exact


def test_runtime_prediction_matches_its_own_measurement(served):
    _, url, _ = served
    memory = httpx.get(url + "/server_info", timeout=10).json()["memory"]
    assert _close(memory["predicted_weights_bytes"], memory["weights_bytes"])
    assert _close(memory["predicted_kv_cache_bytes"], memory["kv_cache_bytes"])
    assert memory["predicted_state_cache_bytes"] == memory["state_cache_bytes"]
    assert memory["predicted_prefix_cache_bytes"] == memory["prefix_cache_bytes"]
    assert memory["predicted_bytes"] == (memory["predicted_weights_bytes"] + memory["predicted_kv_cache_bytes"]
                                         + memory["predicted_state_cache_bytes"]
                                         + memory["predicted_prefix_cache_bytes"])


def test_kv_cache_is_its_rows_over_the_layers_that_keep_kv(served):
    """Per row: 2 (K and V) x layers x kv heads x head_dim x bytes, over the target's
    full-attention layers in the weights' dtype (/server_info kernels.kv_dtype), and over the
    draft's layers for the draft's rows in the dtype it computes in (fp32 for bf16 weights on
    CPU, kernels.compute_dtype)."""
    profile, url, (target_rows, draft_rows) = served
    info = httpx.get(url + "/server_info", timeout=10).json()
    models = read_models(profile, local_reader())
    compute = 4 if info["kernels"]["compute_dtype"] == "float32" else 2
    assert info["kernels"]["compute_dtype"] == ("float32" if info["dtype"] == "float32" or
                                                 (info["device"] == "cpu" and not models.target.linear) else info["dtype"])
    assert info["kernels"]["kv_dtype"] == info["dtype"]
    rows = 4 if info["dtype"] == "float32" else 2

    def per_row(a, width):
        return 2 * a.layers * a.kv_heads * a.head_dim * width
    draft = per_row(models.draft.attention, compute) * draft_rows if models.draft else 0
    assert info["memory"]["kv_cache_bytes"] == per_row(models.target.attention, rows) * target_rows + draft


def test_the_prefix_store_is_its_rows_and_traffic_past_its_capacity_grows_nothing(served):
    """A dense target's prefix store: 128 blocks x 8 rows, each the target's K/V of a position
    in the pool's dtype plus, with a drafter, its target features (taps x hidden) in the dtype it computes
    in; a hybrid keeps none, nor does a server given --disable-radix-cache (/server_info says
    whether it keeps one). Ten prompts of 14 full blocks each (140 > 128) leave every figure as it was."""
    profile, url, _ = served
    before = httpx.get(url + "/server_info", timeout=10).json()
    models = read_models(profile, local_reader())
    compute = 4 if before["kernels"]["compute_dtype"] == "float32" else 2
    kv = 4 if before["kernels"]["kv_dtype"] == "float32" else 2
    a = models.target.attention
    features = models.draft.feature_width if models.draft else 0
    disabled = "--disable-radix-cache" in profile.sglang.extra_args
    row = 0 if models.target.linear or disabled else 2 * a.layers * a.kv_heads * a.head_dim * kv + features * compute
    assert before["memory"]["prefix_cache_bytes"] == 128 * 8 * row
    assert before["prefix_cache"] == (row > 0) and before["disable_radix_cache"] == disabled
    for j in range(10):
        body = {"prompt": [200 + j, *range(5, 121)], "max_tokens": 1, "temperature": 0}
        assert httpx.post(url + "/v1/completions", json=body, timeout=60).status_code == 200
    assert httpx.get(url + "/server_info", timeout=10).json()["memory"] == before["memory"]


def test_a_hybrid_reports_its_linear_state_and_kernels(served):
    """Per Gated DeltaNet layer and state slot: (K-1) x conv channels in the runtime dtype +
    Hv x dk x dv fp32; plain decoding: a slot for each of the 32 running sequences (the default),
    served one sequence at a time: one."""
    profile, url, _ = served
    info = httpx.get(url + "/server_info", timeout=10).json()
    s = read_models(profile, local_reader()).target.linear
    if s is None:
        assert info["memory"]["state_cache_bytes"] == 0
        return
    assert info["kernels"]["compute_dtype"] == info["dtype"]       # a hybrid computes in its weights' dtype
    width = 4 if info["dtype"] == "float32" else 2
    per_layer = (s.conv_kernel - 1) * s.conv_dim * width + s.v_heads * s.k_head_dim * s.v_head_dim * 4
    slots = 1 if profile.method.is_speculative else 32
    assert info["memory"]["state_cache_bytes"] == slots * s.layers * per_layer > 0
    assert info["kernels"]["linear_attention"] == "torch" and info["kernels"]["torch_because"] == "device is cpu"
    assert info["kernels"]["decode_attention"] == ("native" if info["dtype"] == "float32" else "torch")   # this host has cc
    # (a bf16 hybrid computes in bf16, and the kernel attends fp32 rows)
