"""Which implementation runs each part of a loaded target, as /server_info `kernels` reports it:
a native kernel built and probed on this host (serving/kernels/), or the PyTorch form it
replaces, with the reason when the native one does not run."""

from __future__ import annotations

from serving.kernels import decode_attention as decode_kernel
from serving.kernels import rms_norm as norm_kernel
from serving.models import batched
from serving.models.llama import RMSNorm


def target_kernels(target) -> dict:
    """Hybrids name their linear-attention path; every target with a batched decode step, its
    decode attention (serving.models.decode_attention); every target the dtype it computes in
    (activations, drafter: serving.contract.runtime.compute_dtype) and the one its K/V rows are
    kept in (kv_dtype)."""
    kernels = {"attention": "torch sdpa", **getattr(target, "kernels", {}), **getattr(target, "products", {}),
               "compute_dtype": str(target.dtype).removeprefix("torch."),
               "kv_dtype": str(target.kv_dtype).removeprefix("torch.")}
    if any(isinstance(m, RMSNorm) for m in target.modules()):    # a hybrid's zero-centred norms: torch
        kernels.update(_native_or_torch("rms_norm", norm_kernel.available(target.dtype, target.device)))
    if batched.decodes(target):
        served = decode_kernel.available(target.kv_dtype, target.device, target.dtype)
        kernels.update(_native_or_torch("decode_attention", served))
    return kernels


def _native_or_torch(part: str, available: tuple[bool, str]) -> dict:
    native, why = available
    return {part: "native"} if native else {part: "torch", f"{part}_because": why}
