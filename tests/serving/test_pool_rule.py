"""The start-up rule for the bundled runtime's pool (serving.contract.runtime.pool_rows) and the
host memory it caps from (serving.contract.host_memory, serving.device_memory). Pure, milliseconds;
a real server's resolved pool and ddops fit's equal prediction: tests/fit/test_runtime_memory.py."""

from __future__ import annotations

import pytest

from serving import device_memory
from serving.contract.host_memory import host_memory, limit_value, mem_total
from serving.contract.runtime import pool_rows

GIB = 1 << 30
ROW = 64 << 10  # bytes of K/V a row: 32 sequences of 1000 rows take 2 GiB


@pytest.mark.parametrize("memory, fraction, cap, rows", [
    (None, 0.5, None, 32 * 1000),             # memory not known: every running sequence at full context
    (64 * GIB, 0.5, None, 32 * 1000),         # room for more: no more rows than can ever be reserved
    (4 * GIB, 0.5, None, (2 * GIB - GIB) // ROW),   # half of 4 GiB less 1 GiB fixed: 16,384 rows
    (GIB, 0.5, None, 1000),                   # the weights leave nothing: still one full sequence
    (64 * GIB, 0.5, 5000, 5000),              # --max-total-tokens caps the rule
    (4 * GIB, 0.5, 10**7, (2 * GIB - GIB) // ROW),  # a cap above what memory allows changes nothing
    (64 * GIB, 0.5, 600, 600),                # an explicit cap below one sequence is the operator's
])
def test_the_pool_is_every_running_sequence_capped_by_a_share_of_memory(memory, fraction, cap, rows):
    assert pool_rows(1000, None, ROW, GIB, memory, fraction, cap) == rows


def test_max_running_scales_the_rule():
    assert pool_rows(1000, 4, ROW, GIB, None, 0.5, None) == 4000
    assert pool_rows(1000, 1, ROW, GIB, None, 0.5, None) == 1000


MEMINFO = "MemTotal:       24683652 kB\nMemFree:         1000000 kB\nMemAvailable:   9000000 kB\n"


def test_host_memory_is_memtotal_lowered_to_the_smallest_cgroup_limit():
    assert mem_total(MEMINFO) == 24683652 * 1024      # total, never MemAvailable
    assert host_memory(MEMINFO, []) == 24683652 * 1024
    assert host_memory(MEMINFO, [8 * GIB, 4 * GIB]) == 4 * GIB
    assert host_memory(None, [4 * GIB]) == 4 * GIB and host_memory("", []) is None


@pytest.mark.parametrize("text, value", [("4294967296\n", 4 * GIB), ("max\n", None), ("infinity\n", None),
                                         ("9223372036854771712\n", None), ("", None), (None, None)])
def test_a_limit_file_gives_bytes_or_no_limit(text, value):
    """cgroup v2 memory.max ("max"), systemctl's MemoryMax ("infinity"), v1's page-rounded 2**63."""
    assert limit_value(text) == value


def test_cgroup_limits_are_read_up_to_the_root_in_v2_and_v1(tmp_path, monkeypatch):
    unit = tmp_path / "system.slice" / "llm.service"
    unit.mkdir(parents=True)
    (unit / "memory.max").write_text("2147483648\n")          # MemoryMax=2G on the unit
    (tmp_path / "system.slice" / "memory.max").write_text("max\n")
    v1 = tmp_path / "memory" / "box"
    v1.mkdir(parents=True)
    (tmp_path / "memory" / "memory.limit_in_bytes").write_text("3221225472\n")
    monkeypatch.setattr(device_memory, "CGROUP_ROOT", tmp_path)
    assert device_memory._cgroup_limits("0::/system.slice/llm.service\n") == [2 * GIB]
    assert device_memory._cgroup_limits("4:memory:/box\n3:cpu:/\n") == [3 * GIB]
    assert device_memory._cgroup_limits("") == []
