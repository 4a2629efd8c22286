"""Parameter counts and cache bytes of the models the bundled runtime builds, from config numbers
(stdlib only).

One arithmetic for both sides: `serving.memory` predicts the runtime's own allocation with it,
and `ddops.fit` predicts the same allocation before a host is touched (and estimates any
checkpoint's parameters when its safetensors headers are not at hand). Each side reads its
config into these shapes; the formulas live only here. The layouts counted:
- a decoder layer: attention (q, k, v, o projections; an output gate doubles q_proj; optional
  q/k/v biases; optional per-head q and k RMSNorm), a SwiGLU MLP (gate, up, down), two RMSNorms;
- a Gated DeltaNet layer (hybrids) in place of attention: in_proj_qkvz, in_proj_ba, a depthwise
  causal conv, A_log and dt_bias, a gated norm over a value head, out_proj;
- a DFlash draft: fc over the tapped target layers and its norm, its layers (DFlash 2: two grouped
  dynamic causal convs per layer, a candidate selector), a final norm; no embedding or head.
Widths are bytes per element; a fractional one (FP4 with block scales) rounds down once, at the end.
"""

from __future__ import annotations

from dataclasses import dataclass

RECURRENT_BYTES = 4  # the Gated DeltaNet recurrent state is fp32 whatever the runtime dtype


@dataclass(frozen=True)
class AttentionShape:
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    gated: bool = False    # an output gate: q_proj twice as wide (Qwen3.5 / Qwen3-Next full attention)
    bias: bool = False     # q, k and v biases (attention_bias)
    qk_norm: bool = False  # per-head RMSNorm of q and k (Qwen3 and later)

    @property
    def weights(self) -> int:
        """The q, k, v and o projections' matrices."""
        return self.hidden * (self._q_rows + self._kv_rows) + self.heads * self.head_dim * self.hidden

    @property
    def params(self) -> int:
        bias = self._q_rows + self._kv_rows if self.bias else 0
        return self.weights + bias + (2 * self.head_dim if self.qk_norm else 0)

    @property
    def _q_rows(self) -> int:
        return self.heads * self.head_dim * (2 if self.gated else 1)

    @property
    def _kv_rows(self) -> int:
        return 2 * self.kv_heads * self.head_dim


@dataclass(frozen=True)
class DeltaNetShape:
    """Gated DeltaNet: q/k heads of key_head_dim, v heads of value_head_dim, a short conv."""

    key_heads: int
    value_heads: int
    key_head_dim: int
    value_head_dim: int
    conv_kernel: int

    @property
    def conv_dim(self) -> int:
        """Channels through the causal conv: q | k | v."""
        return 2 * self.key_heads * self.key_head_dim + self.value_heads * self.value_head_dim

    @property
    def value_dim(self) -> int:
        return self.value_heads * self.value_head_dim

    def params(self, hidden: int) -> int:
        projections = hidden * (self.conv_dim + 2 * self.value_dim + 2 * self.value_heads)  # qkvz, ba, out
        return projections + self.conv_dim * self.conv_kernel + 2 * self.value_heads + self.value_head_dim

    def state_bytes(self, width: float) -> float:
        """One layer's state of one sequence: conv (K-1) x channels at `width`, recurrent Hv x dk x dv fp32."""
        recurrent = self.value_heads * self.key_head_dim * self.value_head_dim * RECURRENT_BYTES
        return (self.conv_kernel - 1) * self.conv_dim * width + recurrent


def mlp_and_norms(hidden: int, intermediate: int) -> int:
    """A layer's SwiGLU MLP and its two RMSNorms."""
    return 3 * hidden * intermediate + 2 * hidden


def model_params(vocab: int, hidden: int, intermediate: int, attention: AttentionShape, full_layers: int,
                 tied: bool, linear: DeltaNetShape | None = None, linear_layers: int = 0) -> int:
    """A decoder's text model: embeddings (and an untied head), its layers, the final norm."""
    embed = vocab * hidden * (1 if tied else 2)
    mixers = full_layers * attention.params + (linear_layers * linear.params(hidden) if linear_layers else 0)
    return embed + mixers + (full_layers + linear_layers) * mlp_and_norms(hidden, intermediate) + hidden


def draft_params(attention: AttentionShape, intermediate: int, layers: int, taps: int, vocab: int,
                 conv_kernel: int = 0, conv_group: int = 0, selector_rank: int = 0) -> int:
    """A DFlash draft: fc [taps x H -> H] and its norm, the layers, the final norm; DFlash 2 adds
    per layer two grouped dynamic convs (base_kernel [2, K, H], kernel_projection
    [2 x K x H/group, H]) and a selector's two codebooks [V, rank] and hidden_projection [rank, H]."""
    hidden = attention.hidden
    body = layers * (attention.params + mlp_and_norms(hidden, intermediate))
    convs = layers * 2 * (2 * conv_kernel * hidden + hidden * 2 * conv_kernel * (hidden // conv_group)) \
        if conv_kernel else 0
    selector = 2 * vocab * selector_rank + hidden * selector_rank
    return taps * hidden * hidden + hidden + body + hidden + convs + selector


def draft_projection_params(attention: AttentionShape, intermediate: int, layers: int, taps: int) -> int:
    """The part of `draft_params` in projection matrices: fc and each layer's q, k, v, o, gate, up
    and down (what the runtime packs; contract.runtime.draft_projection_dtype)."""
    return taps * attention.hidden * attention.hidden + layers * (attention.weights
                                                                  + 3 * attention.hidden * intermediate)


def kv_bytes(layers: int, kv_heads: int, head_dim: int, rows: int, width: float, v_head_dim: int | None = None) -> int:
    """K and V of `rows` positions: [layers, kv_heads, rows, head_dim] and [.., v_head_dim]."""
    v = head_dim if v_head_dim is None else v_head_dim
    return int(layers * kv_heads * (head_dim + v) * rows * width)


def linear_state_bytes(shape: DeltaNetShape, layers: int, width: float) -> int:
    """One sequence's Gated DeltaNet state over `layers` linear-attention layers."""
    return int(layers * shape.state_bytes(width))
