"""Which SGLang set `install-runtime --runtime sglang` builds for a host (ddops/install/sglang.py),
fast. The CPU set is installed for real on a lab host by tests/deploy/test_lab_sglang.py; a GPU
host's set cannot be installed here (no GPU), so its choice is what this checks."""

import pytest

from ddops import exits
from ddops.install import sglang


def test_a_host_without_a_gpu_gets_the_0_5_15_cpu_set_and_nothing_newer():
    assert sglang.build_for(None) == "cpu"
    cpu = sglang.release("cpu")
    dependencies, itself = cpu.downloads
    assert itself == ("--no-deps", "sglang==0.5.15")          # its CUDA kernel pins left out
    assert {"torch==2.11.0", "torchvision==0.26.0"} <= set(dependencies)
    assert not any(d.startswith(("sglang-kernel", "flashinfer", "flash-attn")) for d in dependencies)
    with pytest.raises(exits.BadInput, match="0.5.23: on a host without a GPU.*sgl-kernel's CPU ops"):
        sglang.release("cpu", "0.5.23")


def test_a_gpu_host_gets_the_release_it_asks_for_with_its_own_pinned_dependencies():
    assert sglang.build_for({"name": "NVIDIA RTX A6000"}) == "cuda"
    gpu = sglang.release("cuda", "0.5.23")
    assert (gpu.build, gpu.downloads, gpu.venv) == ("cuda", (("sglang==0.5.23",),), "/opt/sglang/venv")
