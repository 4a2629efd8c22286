"""The native RMSNorm (serving.kernels.rms_norm) against F.rms_norm, and where a model uses it."""

import pytest
import torch
import torch.nn.functional as F

from serving.kernels import rms_norm as native
from serving.models.llama import RMSNorm


def test_the_kernel_builds_and_passes_its_probe_on_this_host():
    ok, why = native.available(torch.float32, "cpu")   # make setup installs gcc; a wrong kernel fails its probe
    assert ok, why
    ok, why = native.available(torch.bfloat16, "cpu")
    assert not ok and "bfloat16" in why


@pytest.mark.parametrize("make", [
    lambda: torch.randn(1, 576),                                     # one decode row
    lambda: torch.randn(16, 576),
    lambda: torch.randn(7, 15 * 64)[:, :9 * 64].view(7, 9, 64),       # q heads viewed out of a projection
    lambda: torch.randn(5, 12, 64)[:, 9:],                            # k heads after q
    lambda: torch.randn(2, 3, 4, 64),                                 # other ranks: made contiguous
    lambda: torch.randn(64),
    lambda: torch.randn(0, 576),
])
def test_the_kernel_agrees_with_f_rms_norm_on_every_layout(make):
    torch.manual_seed(0)
    x = make()
    weight = torch.randn(x.shape[-1])
    got = native.rms_norm(x, weight, 1e-5)
    assert got.shape == x.shape and got.is_contiguous()
    assert torch.allclose(got, F.rms_norm(x, (x.shape[-1],), weight, 1e-5), atol=2e-6, rtol=2e-6)


def test_a_model_norm_runs_native_for_inference_and_torch_for_gradients():
    norm = RMSNorm(32, 1e-6, torch.float32)
    torch.nn.init.normal_(norm.weight)
    x = torch.randn(3, 32)
    with torch.inference_mode():
        assert native.usable(x, norm.weight)
        assert torch.allclose(norm(x), F.rms_norm(x, (32,), norm.weight, 1e-6), atol=2e-6)
    x.requires_grad_(True)
    assert not native.usable(x, norm.weight)
    norm(x).sum().backward()                # the PyTorch form, so gradients flow
    assert x.grad is not None and norm.weight.grad is not None
    assert not native.usable(torch.randn(3, 32, dtype=torch.bfloat16), norm.weight)
