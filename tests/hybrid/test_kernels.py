"""Kernel choice for the Gated DeltaNet ops, and the layout adapters that feed the CUDA kernels.

On this CPU machine no kernel may be chosen (device, forced flag, package absent, signature
mismatch each say why), and the adapters must reshape to the kernels' conventions exactly:
the adapters over PyTorch references written in those conventions (tests/hybrid/kernel_convention.py)
equal our direct PyTorch path, op by op and through a whole model (prefill, decode).
"""

from __future__ import annotations

import importlib.util

import pytest
import torch

from serving.models import gdn_kernels, gdn_ops
from serving.models.delta_rule import l2_normalise
from serving.models.gdn_kernels import TORCH, KernelChoice, lookup, select

from .kernel_convention import REFERENCE

H, DK, DV, C, K = 6, 16, 8, 56, 4


def heads(T: int, seed: int = 0):
    """Our layout: q, k [T, H, dk] normalised (q scaled), v [T, H, dv], g <= 0, beta in (0, 1)."""
    gen = torch.Generator().manual_seed(seed)
    q = l2_normalise(torch.randn(T, H, DK, generator=gen)) * DK ** -0.5
    k = l2_normalise(torch.randn(T, H, DK, generator=gen))
    v = torch.randn(T, H, DV, generator=gen)
    g = -torch.rand(T, H, generator=gen)
    beta = torch.rand(T, H, generator=gen)
    return q, k, v, g, beta


def test_on_cpu_every_op_runs_in_torch_and_says_why(monkeypatch):
    monkeypatch.delenv(gdn_kernels.FORCE_ENV, raising=False)
    choice = select("cpu", torch.bfloat16)
    assert (choice.chunk, choice.recurrent, choice.conv_chain, choice.conv_step) == (None,) * 4
    report = choice.report()
    assert report["linear_attention"] == "torch" and report["conv"] == "torch"
    assert report["torch_because"] == "device is cpu"
    assert report["linear_attention_ops"]["verify"] == "torch by depth"


def test_the_flag_forces_torch_and_a_bad_value_is_refused(monkeypatch):
    monkeypatch.setenv(gdn_kernels.FORCE_ENV, "torch")
    assert select("cuda", torch.bfloat16).report()["torch_because"] == "DDOPS_HYBRID_KERNELS=torch"
    monkeypatch.setenv(gdn_kernels.FORCE_ENV, "triton")
    with pytest.raises(ValueError, match="DDOPS_HYBRID_KERNELS must be 'auto' or 'torch'"):
        select("cuda", torch.bfloat16)


@pytest.mark.skipif(importlib.util.find_spec("fla") is not None, reason="fla is installed here")
def test_on_cuda_without_the_packages_torch_runs_and_names_them(monkeypatch):
    monkeypatch.delenv(gdn_kernels.FORCE_ENV, raising=False)
    choice = select("cuda", torch.bfloat16)   # a device name is enough: nothing is allocated
    assert choice.chunk is None and choice.recurrent is None
    assert "fla.ops.gated_delta_rule.chunk_gated_delta_rule unavailable" in choice.why_torch
    assert "fused_recurrent_gated_delta_rule unavailable" in choice.why_torch


def test_a_kernel_whose_signature_lacks_our_keywords_is_not_taken():
    # a module that imports, with a function of that name that lacks keywords we pass
    fn, why = lookup(("torch.nn.functional", "silu", {"input", "inplace", "initial_state"}))
    assert fn is None and why == "torch.nn.functional.silu lacks initial_state"
    fn, why = lookup(("torch.nn.functional", "silu", {"input", "inplace"}))
    assert fn is torch.nn.functional.silu and why == ""


def test_chain_adapter_matches_torch():
    q, k, v, g, beta = heads(70)              # two chunks, the second partial
    state = torch.randn(H, DK, DV)
    o_ref, s_ref = gdn_ops.chain_delta_rule(TORCH, q, k, v, g, beta, state, torch.float32)
    o, s = gdn_ops.chain_delta_rule(REFERENCE, q, k, v, g, beta, state, torch.float32)
    torch.testing.assert_close(o, o_ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(s, s_ref, atol=1e-5, rtol=1e-5)


def test_step_adapter_matches_torch_for_many_sequences():
    q, k, v, g, beta = heads(5, seed=1)       # 5 sequences, one token each
    states = torch.randn(5, H, DK, DV)
    o_ref, s_ref = gdn_ops.step_delta_rule(TORCH, q, k, v, g, beta, states)
    o, s = gdn_ops.step_delta_rule(REFERENCE, q, k, v, g, beta, states)
    torch.testing.assert_close(o, o_ref, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(s, s_ref, atol=1e-6, rtol=1e-6)


def test_conv_adapters_match_torch_and_leave_the_committed_window_alone():
    gen = torch.Generator().manual_seed(2)
    inputs, weight = torch.randn(K - 1 + 9, C, generator=gen), torch.randn(C, K, generator=gen)
    torch.testing.assert_close(gdn_ops.chain_conv(REFERENCE, inputs, weight), gdn_ops.chain_conv(TORCH, inputs, weight))
    window, x = torch.randn(3, K - 1, C, generator=gen), torch.randn(3, C, generator=gen)
    before = window.clone()
    out, after = gdn_ops.step_conv(REFERENCE, window, x, weight)
    torch_out, torch_after = gdn_ops.step_conv(TORCH, window, x, weight)
    torch.testing.assert_close(out, torch_out)
    assert torch.equal(window, before)        # the kernel updates its own copy only
    assert torch.equal(after, torch.cat([window[:, 1:], x[:, None]], dim=1)) and torch.equal(after, torch_after)


def test_a_whole_hybrid_through_the_adapters_equals_the_torch_path(hf_pairs):
    """Prefill (a chunked chain) then single decode steps, logits compared row by row."""
    model = hf_pairs["lllf-lllf"][1]
    prompt = torch.arange(3, 43) % 250
    runs = {}
    for name, choice in (("torch", TORCH), ("adapters", REFERENCE)):
        model._ops = choice
        cache = model.new_cache(64)
        logits, _ = model.forward(prompt, torch.arange(40), cache, last_only=True)
        cache.commit(40)
        steps = [logits]
        for t in range(4):
            token = steps[-1].argmax(-1)
            steps.append(model.forward(token, torch.tensor([40 + t]), cache)[0])
            cache.commit(1)
        runs[name] = torch.cat(steps)
    model._ops = None
    torch.testing.assert_close(runs["adapters"], runs["torch"], atol=1e-4, rtol=1e-4)


def test_the_gpu_check_compares_every_op_and_a_whole_model(tmp_path):
    """serving.bench.hybrid_cuda's comparisons on CPU, the references standing in for the kernels:
    its reshaping, timing and verdict plumbing works before a GPU session spends time on it."""
    from serving.bench import hybrid_cuda
    from serving.tools.tiny import write_tiny

    rows = hybrid_cuda.op_rows(REFERENCE, torch.float32, prompt=70, batch=3, dev="cpu")
    rows += hybrid_cuda.model_rows(write_tiny(tmp_path / "hybrid", "qwen3_5"), REFERENCE, torch.float32, dev="cpu")
    assert [row[0].split(" (")[0] for row in rows] == [
        "prefill delta rule", "decode delta rule", "prefill conv", "decode conv", "model prefill 297 + 16 steps"]
    assert all(row[-1] for row in rows), rows


def _transposed_state_recurrent(**kw):
    """The reference with its state read V x K: a changed convention a signature does not show."""
    kw["initial_state"] = kw["initial_state"].transpose(-1, -2).contiguous().reshape(kw["initial_state"].shape)
    return REFERENCE.recurrent(**kw)


def _refusing_conv(**kw):
    raise RuntimeError("no kernel image for this shape")


def test_the_probe_keeps_kernels_that_agree_and_drops_the_rest(hf_pairs):
    linear = hf_pairs["lllf-lllf"][1].config.linear
    kept = gdn_ops.probe(REFERENCE, linear, torch.float32, "cpu")
    assert kept == REFERENCE
    mixed = KernelChoice(chunk=REFERENCE.chunk, recurrent=_transposed_state_recurrent,
                         conv_chain=REFERENCE.conv_chain, conv_step=_refusing_conv, why_torch="")
    probed = gdn_ops.probe(mixed, linear, torch.float32, "cpu")
    assert probed.chunk is REFERENCE.chunk and probed.conv_chain is REFERENCE.conv_chain
    assert probed.recurrent is None and probed.conv_step is None
    assert "recurrent kernel differs from PyTorch" in probed.why_torch
    assert "conv_step kernel failed its probe (RuntimeError: no kernel image" in probed.why_torch
    assert gdn_ops.probe(TORCH, linear, torch.float32, "cpu") is TORCH      # nothing to probe on CPU
