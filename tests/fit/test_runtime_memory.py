"""Prediction vs measurement on CPU: the ops planner's allocation model of the bundled runtime
against what a real `python -m serving` process reports under /server_info `memory`.

Tolerance: 1% of each figure. Both sides count every parameter in the runtime dtype and one
preallocated target KV cache, so they agree exactly today; the margin only absorbs a buffer the
runtime may add later (rope tables, say) without hiding a wrong formula (a missed layer or a
GQA slip is 10% or more on these models).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import httpx
import pytest

from ddops.fit import local_reader, read_models
from ddops.fit.bundled import bundled_memory
from ddops.profile import load_profile
from tests.server_process import THREADS, ServerProcess

TOLERANCE = 0.01


@pytest.fixture(scope="module", params=[("llama", "float32"), ("qwen3", "bfloat16"), ("qwen3_5", "bfloat16")])
def served(request, tmp_path_factory):
    """A tiny checkpoint from the project's tool, a bundled profile for it, a real server."""
    arch, dtype = request.param
    root = tmp_path_factory.mktemp(f"fit-{arch}")
    model = root / f"tiny-{arch}"
    subprocess.run([sys.executable, "-m", "serving.tools.tiny", "--arch", arch, "--out", str(model),
                    "--dtype", dtype, "--shards", "2" if arch == "qwen3" else "1"],
                   check=True, capture_output=True, env={**os.environ, **THREADS})
    (root / "p.yaml").write_text(textwrap.dedent(f"""\
        runtime: bundled
        model: {{path: {model}, served_name: tiny, dtype: {dtype}}}
        memory: {{context_length: 384}}
        service: {{device: cpu}}
        """))
    profile = load_profile(str(root / "p.yaml"))
    server = ServerProcess(model, root / "server.log", "--dtype", dtype, "--context-length", "384")
    try:
        server.wait_ready()
        yield profile, server.url
    finally:
        server.stop()


def _close(predicted: int, measured: int) -> bool:
    return abs(predicted - measured) <= TOLERANCE * measured


def test_ops_prediction_matches_the_runtime_measurement(served):
    profile, url = served
    memory = httpx.get(url + "/server_info", timeout=10).json()["memory"]
    ops = bundled_memory(profile, read_models(profile, local_reader()))
    assert memory["weights_bytes"] > 0 and memory["kv_cache_bytes"] > 0
    assert _close(ops.weights_bytes, memory["weights_bytes"]), (ops, memory)
    assert _close(ops.kv_cache_bytes, memory["kv_cache_bytes"]), (ops, memory)
    assert ops.state_cache_bytes == memory["state_cache_bytes"], (ops, memory)   # 0 unless hybrid
    assert _close(ops.predicted_bytes, memory["measured_bytes"])


def test_runtime_prediction_matches_its_own_measurement(served):
    _, url = served
    memory = httpx.get(url + "/server_info", timeout=10).json()["memory"]
    assert _close(memory["predicted_weights_bytes"], memory["weights_bytes"])
    assert _close(memory["predicted_kv_cache_bytes"], memory["kv_cache_bytes"])
    assert memory["predicted_state_cache_bytes"] == memory["state_cache_bytes"]
    assert memory["predicted_bytes"] == (memory["predicted_weights_bytes"] + memory["predicted_kv_cache_bytes"]
                                         + memory["predicted_state_cache_bytes"])


def test_kv_cache_grows_with_the_context_length_as_predicted(served):
    """384 slots over the full-attention layers: 2 (K and V) x layers x kv heads x head_dim x dtype bytes."""
    profile, url = served
    info = httpx.get(url + "/server_info", timeout=10).json()
    models = read_models(profile, local_reader())
    a, width = models.target.attention, 4 if info["dtype"] == "float32" else 2
    per_slot = 2 * a.layers * a.kv_heads * a.head_dim * width
    assert info["memory"]["kv_cache_bytes"] == per_slot * 384


def test_a_hybrid_reports_its_linear_state_and_kernels(served):
    """Per Gated DeltaNet layer and state slot: (K-1) x conv channels in the runtime dtype +
    Hv x dk x dv fp32; plain decoding: a slot for each of the 32 running sequences (the default)."""
    profile, url = served
    info = httpx.get(url + "/server_info", timeout=10).json()
    s = read_models(profile, local_reader()).target.linear
    if s is None:
        assert info["memory"]["state_cache_bytes"] == 0
        return
    width = 4 if info["dtype"] == "float32" else 2
    per_layer = (s.conv_kernel - 1) * s.conv_dim * width + s.v_heads * s.k_head_dim * s.v_head_dim * 4
    assert info["memory"]["state_cache_bytes"] == 32 * s.layers * per_layer > 0
    assert info["kernels"]["linear_attention"] == "torch" and info["kernels"]["torch_because"] == "device is cpu"
