"""SGLang's pool on a CPU host: sized from the host's free RAM per NUMA node (docs/sglang.md
"Memory"). The figures are a lab host's, measured 2026-12-05 with SGLang 0.5.15; the live
comparison is tests/deploy/test_lab_sglang.py."""

from __future__ import annotations

from ddops.fit import Setup, assess, plan
from ddops.fit.host_memory import node_memory
from ddops.fit.profile_fit import cpu_device
from tests.fit.conftest import facts

GIB = 1 << 30
MEMINFO = "MemTotal:       24683784 kB\nMemFree:         1000000 kB\nMemAvailable:   14806528 kB\n"
NODE0 = "Node 0 MemTotal:       24683784 kB"


def test_the_host_read_gives_a_node_and_counts_the_replaced_unit_as_free():
    node = node_memory(MEMINFO, NODE0, "536870912")
    assert (node.nodes, node.total, node.available) == (1, 24683784 * 1024, 14806528 * 1024 + 536870912)
    two = node_memory(MEMINFO, NODE0 + "\nNode 1 MemTotal:       20000000 kB", "[not set]")
    assert (two.nodes, two.total, two.available) == (2, 20000000 * 1024, 14806528 * 1024 // 2)
    assert node_memory("MemTotal: 1 kB\n", NODE0, None) is None        # no MemAvailable: cannot say


def cpu(available_gib: float, **kw) -> Setup:
    node = node_memory(MEMINFO, NODE0, None)
    base = dict(gpu=cpu_device(node), tp=1, fraction=0.1, context_length=2048, weights_dtype="float32",
                kv_dtype="float32", max_running_requests=4, cuda_graphs=False, available=int(available_gib * GIB),
                sglang_version="0.5.15")
    return Setup(**{**base, **kw})


def test_the_pool_is_the_fraction_of_what_was_free_less_the_weights():
    """SGLang logged 13.25 GB free before its weights at fraction 0.1 and sized 18,391 tokens."""
    smollm = facts("smollm2-135m-instruct")
    pools = plan(cpu(13.25), smollm)
    assert pools.pre == int(13.25 * GIB) and pools.cell == 30 * 3 * 128 * 4
    assert abs(pools.kv_tokens - 18391) <= 0.05 * 18391, pools.kv_tokens


def test_sglang_0_5_15_default_fraction_on_a_23_5_gib_node_is_the_measured_0_846():
    pools = plan(cpu(13.0, fraction=None), facts("smollm2-135m-instruct"))
    assert pools.fraction == 0.846


def test_a_fraction_below_the_weights_is_refused_and_a_cpu_headroom_is_no_failure():
    smollm = facts("smollm2-135m-instruct")
    low = assess(cpu(14.0, fraction=0.01), smollm).verdict
    assert not low.fits and "Loaded weights leave no GPU memory" in low.reasons[0]
    default = assess(cpu(14.0, fraction=None), smollm).verdict
    assert default.fits, default.reasons      # 0.846 leaves less than SGLang's reserve: fine on a CPU
