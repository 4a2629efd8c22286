"""Which implementation runs each Gated DeltaNet op: the field's CUDA kernels, or plain PyTorch.

Chosen once per model from capabilities, never from names of devices or models:
- `fla` (flash-linear-attention / fla-core, Triton): `chunk_gated_delta_rule` for causal chains
  (prefill; the kernel refuses float32 inputs, so only bf16/fp16 models) and
  `fused_recurrent_gated_delta_rule` for one new token per sequence (decode, batched decode);
- `causal-conv1d` (CUDA): `causal_conv1d_fn` for chains, `causal_conv1d_update` for one token;
- otherwise, and always on CPU, for verify chains and for draft trees (no kernel keeps the state
  after every row, nor takes a tree), the PyTorch forms in serving.models.delta_rule, which
  are also the reference the kernels are tested against (serving/bench/hybrid_cuda.py).
A kernel is taken only when the device is CUDA, its package imports, its function has the
keyword arguments called below, and (HybridLM.ops, gdn_ops.probe) one call at the model's
shapes agrees with PyTorch. DDOPS_HYBRID_KERNELS=torch forces the PyTorch path.
/server_info `kernels` reports the choice and why (HybridLM.kernels).
"""

from __future__ import annotations

import importlib
import inspect
import os
from dataclasses import dataclass

import torch

FORCE_ENV = "DDOPS_HYBRID_KERNELS"

# (module, function, keyword arguments this runtime passes)
FLA_CHUNK = ("fla.ops.gated_delta_rule", "chunk_gated_delta_rule",
             {"q", "k", "v", "g", "beta", "scale", "initial_state", "output_final_state", "use_qk_l2norm_in_kernel"})
FLA_RECURRENT = ("fla.ops.gated_delta_rule", "fused_recurrent_gated_delta_rule",
                 {"q", "k", "v", "g", "beta", "scale", "initial_state", "output_final_state",
                  "use_qk_l2norm_in_kernel"})
CONV_CHAIN = ("causal_conv1d", "causal_conv1d_fn",
              {"x", "weight", "bias", "initial_states", "return_final_states", "activation"})
CONV_STEP = ("causal_conv1d", "causal_conv1d_update", {"x", "conv_state", "weight", "bias", "activation"})


@dataclass(frozen=True)
class KernelChoice:
    """The callable per op (None: PyTorch) and the reason the PyTorch path runs, if it does."""
    chunk: object = None        # fla.chunk_gated_delta_rule
    recurrent: object = None    # fla.fused_recurrent_gated_delta_rule
    conv_chain: object = None   # causal_conv1d.causal_conv1d_fn
    conv_step: object = None    # causal_conv1d.causal_conv1d_update
    why_torch: str = ""

    def report(self) -> dict:
        """/server_info `kernels` entries of a hybrid target."""
        fla_used = self.chunk is not None or self.recurrent is not None
        conv_used = self.conv_chain is not None or self.conv_step is not None
        out = {"linear_attention": "fla" if fla_used else "torch",
               "conv": "causal-conv1d" if conv_used else "torch",
               "linear_attention_ops": {
                   "prefill": "fla chunk_gated_delta_rule" if self.chunk else "torch chunked",
                   "decode": "fla fused_recurrent_gated_delta_rule" if self.recurrent else "torch recurrence",
                   "verify": "torch by depth",
                   "conv_prefill": "causal_conv1d_fn" if self.conv_chain else "torch conv1d",
                   "conv_decode": "causal_conv1d_update" if self.conv_step else "torch conv1d"}}
        if self.why_torch:
            out["torch_because"] = self.why_torch
        return out


TORCH = KernelChoice()   # every op in PyTorch (verify chains and trees always run so)


def lookup(spec) -> tuple[object, str]:
    """(the function, "") when its package imports and it takes the keywords we pass, else (None, why)."""
    module_name, name, keywords = spec
    try:
        fn = getattr(importlib.import_module(module_name), name)
    except (ImportError, AttributeError) as e:   # absent, or a build that cannot load here
        return None, f"{module_name}.{name} unavailable ({type(e).__name__})"
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return None, f"{module_name}.{name} has no readable signature"
    missing = keywords - set(params)
    if missing and not any(p.kind is p.VAR_KEYWORD for p in params.values()):
        return None, f"{module_name}.{name} lacks {', '.join(sorted(missing))}"
    return fn, ""


def select(device, dtype: torch.dtype, force: str | None = None) -> KernelChoice:
    """The kernels a model on `device` in `dtype` runs; `force` (or $DDOPS_HYBRID_KERNELS) "torch" pins PyTorch."""
    force = force if force is not None else os.environ.get(FORCE_ENV, "auto")
    if force not in ("auto", "torch"):
        raise ValueError(f"{FORCE_ENV} must be 'auto' or 'torch', not {force!r}")
    if force == "torch":
        return KernelChoice(why_torch=f"{FORCE_ENV}=torch")
    if torch.device(device).type != "cuda":
        return KernelChoice(why_torch=f"device is {torch.device(device).type}")
    found, why = {}, []
    for field, spec in (("chunk", FLA_CHUNK), ("recurrent", FLA_RECURRENT),
                        ("conv_chain", CONV_CHAIN), ("conv_step", CONV_STEP)):
        found[field], reason = lookup(spec)
        if reason:
            why.append(reason)
    if found["chunk"] is not None and dtype == torch.float32:
        found["chunk"] = None                 # the chunked kernel takes bf16/fp16 only
        why.append("chunk_gated_delta_rule needs bf16/fp16 (model is float32)")
    return KernelChoice(**found, why_torch="; ".join(why))
