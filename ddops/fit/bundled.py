"""What the bundled runtime (`python -m serving`) allocates for a profile. Pure.

Its allocation model is simple and exact: every parameter in the runtime's dtype, one
preallocated KV cache for the target of `context_length + verify_tokens` slots over its
full-attention layers (the extra slots hold one verify pass past the context), and for hybrid
targets linear-attention state slots (conv state in the runtime dtype, recurrent state in fp32
whatever the config's mamba_ssm_dtype): one per running sequence when decoding plainly, one
with a speculative method (serving.contract.runtime.state_slots, the runtime's own rule). The draft's context K/V grows with each
sequence and is not preallocated, so it is not part of the prediction. The runtime reports the
same numbers, measured from its tensors, under `/server_info` `memory`.
"""

from __future__ import annotations

from dataclasses import dataclass

from ddops.fit.model import LinearState, ModelFacts, dtype_bytes
from serving.contract.runtime import state_slots
from ddops.fit.profile_fit import Models, verify_tokens
from ddops.profile import Profile


@dataclass(frozen=True)
class BundledMemory:
    dtype: str
    kv_slots: int
    weights_bytes: int
    kv_cache_bytes: int
    state_cache_bytes: int = 0

    @property
    def predicted_bytes(self) -> int:
        return self.weights_bytes + self.kv_cache_bytes + self.state_cache_bytes

    def as_dict(self) -> dict:
        return {"dtype": self.dtype, "kv_slots": self.kv_slots, "weights_bytes": self.weights_bytes,
                "kv_cache_bytes": self.kv_cache_bytes, "state_cache_bytes": self.state_cache_bytes,
                "predicted_bytes": self.predicted_bytes}


def runtime_dtype(profile: Profile, target: ModelFacts) -> str:
    """The runtime's --dtype auto: the checkpoint's dtype on CUDA, float32 on CPU."""
    if profile.model.dtype != "auto":
        return profile.model.dtype
    return target.dtype if profile.service.device == "cuda" else "float32"


def bundled_memory(profile: Profile, models: Models) -> BundledMemory:
    target, draft = models.target, models.draft
    dtype = runtime_dtype(profile, target)
    slots = (profile.memory.context_length or target.max_position_embeddings) + verify_tokens(profile, draft)
    weights = target.weight_bytes(dtype) + (draft.weight_bytes(dtype) if draft else 0)
    a = target.attention
    kv = int(a.layers * a.kv_heads * (a.head_dim + a.v_head_dim) * slots * dtype_bytes(dtype))
    sequences = state_slots(target.linear is not None, profile.method.is_speculative,
                            profile.memory.max_running_requests)
    return BundledMemory(dtype, slots, weights, kv, sequences * linear_state_bytes(target.linear, dtype))


def linear_state_bytes(s: LinearState | None, dtype: str) -> int:
    """One sequence's Gated DeltaNet state: (K-1) x conv channels in `dtype`, Hv x dk x dv in fp32."""
    if s is None:
        return 0
    conv = (s.conv_kernel - 1) * s.conv_dim * dtype_bytes(dtype)
    return int(s.layers * (conv + s.v_heads * s.k_head_dim * s.v_head_dim * 4))
