"""Memory facts of one checkpoint, from its config.json (+ safetensors sizes when present). Pure.

What the planner needs from a model: how many parameters it loads (exactly, from safetensors
headers, or estimated from the config by the runtime's own formulas in
serving.contract.sizes), the geometry of the layers that keep a KV cache
(full-attention layers only on hybrids), and the per-request recurrent state of the
linear-attention (mamba / Gated DeltaNet) layers. DFlash drafts have no embedding or LM head
of their own: `fc` projects K tapped target layers (K x hidden -> hidden) instead.
"""

from __future__ import annotations

from dataclasses import dataclass

from ddops import exits
from serving.contract.drafts import architecture, draft_arch, draft_value
from serving.contract.pairing import target_layer_ids
from serving.contract.sizes import AttentionShape, DeltaNetShape, draft_params, draft_projection_params, model_params

DTYPE_BYTES = {"float32": 4, "float": 4, "bfloat16": 2, "float16": 2, "half": 2,
               "fp8_e4m3": 1, "fp8_e5m2": 1, "fp4_e2m1": 0.5,
               # FP4 E2M1 recipes with one 1-byte scale per 16 elements (nvfp4, fp4_mx_block16)
               "fp4_block16": 0.5 + 1 / 16}
FULL = "full_attention"
LINEAR = "linear_attention"


class ModelFactsError(exits.BadInput, ValueError):
    """A config the planner cannot read; one line naming the file and key."""


@dataclass(frozen=True)
class Attention:
    """Layers that keep K/V for every token."""

    layers: int
    kv_heads: int
    head_dim: int
    v_head_dim: int


@dataclass(frozen=True)
class LinearState:
    """Recurrent state of linear-attention layers: one copy per request slot, not per token."""

    layers: int
    k_heads: int
    v_heads: int
    k_head_dim: int
    v_head_dim: int
    conv_kernel: int
    ssm_dtype: str  # the config's mamba_ssm_dtype (SGLang's default for --mamba-ssm-dtype)

    @property
    def shape(self) -> DeltaNetShape:
        return DeltaNetShape(self.k_heads, self.v_heads, self.k_head_dim, self.v_head_dim, self.conv_kernel)

    @property
    def conv_dim(self) -> int:
        return self.shape.conv_dim


@dataclass(frozen=True)
class ModelFacts:
    path: str
    architecture: str
    dtype: str  # the dtype the checkpoint declares
    params: int  # floating-point parameters (loaded in the runtime's dtype)
    fixed_bytes: int  # quantized / integer tensors, loaded as stored
    params_source: str  # "safetensors headers" | "config estimate"
    hidden_size: int
    vocab_size: int
    num_layers: int
    max_position_embeddings: int
    attention: Attention
    linear: LinearState | None = None
    block_size: int | None = None  # DFlash drafts: tokens drafted per block
    attention_heads: int = 0  # num_attention_heads (query heads)
    kv_heads_declared: bool = True  # False: no num_key_value_heads, read as num_attention_heads
    feature_width: int = 0  # DFlash drafts: target features per position (taps x hidden size)
    intermediate_size: int = 0  # the MLP's width (vLLM's activation estimate)
    projection_params: int = 0  # DFlash drafts: params in projection matrices (sizes.draft_projection_params)

    def weight_bytes(self, dtype: str | None = None) -> int:
        """Bytes once loaded in `dtype` (default: the checkpoint's own)."""
        return int(self.params * dtype_bytes(dtype or self.dtype)) + self.fixed_bytes


def dtype_bytes(dtype: str) -> float:
    if dtype not in DTYPE_BYTES:
        raise ModelFactsError(f"dtype {dtype!r} unknown (known: {', '.join(DTYPE_BYTES)})")
    return DTYPE_BYTES[dtype]


def text_config(config: dict) -> dict:
    """Multimodal checkpoints (Qwen3.5/3.6) nest the language model's fields in text_config."""
    if "hidden_size" not in config and isinstance(config.get("text_config"), dict):
        return {**config, **config["text_config"]}
    return config


def is_draft(config: dict) -> bool:
    return "dflash_config" in config or "block_size" in config and "num_target_layers" in config


def facts_from_config(config: dict, path: str, params: tuple[int, int] | None = None) -> ModelFacts:
    """`params` = (float params, fixed bytes) from safetensors headers; estimated when None."""
    c = text_config(config)
    get = _getter(c, path)
    hidden, heads, layers = get("hidden_size"), get("num_attention_heads"), get("num_hidden_layers")
    head_dim = int(c.get("head_dim") or hidden // heads)
    kinds = layer_kinds(c, layers)
    attention = Attention(kinds.count(FULL) if not is_draft(c) else layers,
                          int(c.get("num_key_value_heads") or heads), head_dim,
                          int(c.get("v_head_dim") or head_dim))
    linear = _linear(c, kinds.count(LINEAR), path)
    estimated = params is None
    if estimated:
        params = (estimate_params(c, kinds, path), 0)
    return ModelFacts(
        path=path, architecture=(c.get("architectures") or [c.get("model_type", "?")])[0],
        dtype=str(c.get("torch_dtype") or c.get("dtype") or "bfloat16"),
        params=params[0], fixed_bytes=params[1],
        params_source="config estimate" if estimated else "safetensors headers",
        hidden_size=hidden, vocab_size=get("vocab_size"), num_layers=layers,
        max_position_embeddings=int(c.get("max_position_embeddings") or 0),
        attention=attention, linear=linear,
        block_size=int(draft_value(c, "block_size")) if draft_value(c, "block_size") else None,
        attention_heads=int(heads), kv_heads_declared=c.get("num_key_value_heads") is not None,
        feature_width=_feature_width(c, path) if is_draft(c) else 0,
        intermediate_size=int(c.get("intermediate_size") or 0),
        projection_params=_draft_projections(c, layers) if is_draft(c) else 0,
    )


def _feature_width(c: dict, path: str) -> int:
    """A draft's fc input: len(target_layer_ids) x its hidden size (the runtime's own rule)."""
    try:
        return len(target_layer_ids(c)) * int(c["hidden_size"])
    except (KeyError, TypeError, ValueError) as err:
        raise ModelFactsError(f"{path}: dflash_config.target_layer_ids / num_target_layers "
                              f"missing or malformed ({err})") from None


def layer_kinds(c: dict, layers: int) -> list[str]:
    """Per layer: full_attention or linear_attention (sliding layers keep KV: full here)."""
    if c.get("layer_types"):
        return [LINEAR if kind == LINEAR else FULL for kind in c["layer_types"]][:layers]
    interval = c.get("full_attention_interval")
    if interval:  # Qwen3-Next layout: every interval-th layer is full attention
        return [FULL if (i + 1) % int(interval) == 0 else LINEAR for i in range(layers)]
    return [FULL] * layers


def _linear(c: dict, layers: int, path: str) -> LinearState | None:
    if not layers:
        return None
    get = _getter(c, path)
    return LinearState(layers, get("linear_num_key_heads"), get("linear_num_value_heads"),
                       get("linear_key_head_dim"), get("linear_value_head_dim"),
                       int(c.get("linear_conv_kernel_dim", 4)),
                       str(c.get("mamba_ssm_dtype") or "float32"))


def estimate_params(c: dict, kinds: list[str], path: str) -> int:
    """Parameter count of the text model from its config (dense FFN; MoE needs safetensors)."""
    if c.get("num_experts") or c.get("n_routed_experts"):
        raise ModelFactsError(f"{path}: num_experts: mixture-of-experts sizes need the safetensors "
                              f"headers (weights not found next to config.json)")
    get = _getter(c, path)
    hidden, inter = get("hidden_size"), get("intermediate_size")
    if is_draft(c):
        taps = len((c.get("dflash_config") or {}).get("target_layer_ids") or [0] * len(kinds))
        return _draft_params(c, _attention_shape(c), inter, len(kinds), taps, path)
    linear = _linear(c, 1, path) if LINEAR in kinds else None
    return model_params(get("vocab_size"), hidden, inter, _attention_shape(c), kinds.count(FULL),
                        bool(c.get("tie_word_embeddings")), linear.shape if linear else None, kinds.count(LINEAR))


def _draft_params(c: dict, attention: AttentionShape, inter: int, layers: int, taps: int, path: str) -> int:
    """With what the draft's architecture adds (serving/contract/drafts.py): DFlash 2's convs and selector."""
    arch = draft_arch(c)
    if arch is None:
        raise ModelFactsError(f"{path}: architectures: {architecture(c)} is not a draft architecture ddops "
                              f"knows (serving/contract/drafts.py)")
    try:
        convs = (int(draft_value(c, "conv_kernel_size")), int(draft_value(c, "conv_group_size"))) if arch.convs \
            else (0, 0)
        rank = int(draft_value(c, "selector_rank")) if arch.selector else 0
        return draft_params(attention, inter, layers, taps, int(c["vocab_size"]), *convs, rank)
    except (TypeError, ValueError, ZeroDivisionError) as err:
        raise ModelFactsError(f"{path}: dflash_config conv/selector fields missing or malformed ({err})") from None


def _draft_projections(c: dict, layers: int) -> int:
    return draft_projection_params(_attention_shape(c), int(c.get("intermediate_size") or 0), layers,
                                   len(target_layer_ids(c)))


def _attention_shape(c: dict) -> AttentionShape:
    hidden, heads = c["hidden_size"], c["num_attention_heads"]
    return AttentionShape(hidden, heads, int(c.get("num_key_value_heads") or heads),
                          int(c.get("head_dim") or hidden // heads),
                          gated=bool(c.get("attn_output_gate", _is_hybrid(c))),
                          bias=bool(c.get("attention_bias")),
                          qk_norm=c.get("model_type", "").startswith("qwen3"))


def _is_hybrid(c: dict) -> bool:
    return LINEAR in (c.get("layer_types") or []) or bool(c.get("full_attention_interval"))


def _getter(c: dict, path: str):
    def get(key: str) -> int:
        value = c.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ModelFactsError(f"{path}: {key}: missing or not a positive integer ({value!r})")
        return value
    return get
