"""ModelConfig: the architecture facts of an HF checkpoint, read once from config.json.

Supports `LlamaForCausalLM`, `Qwen3ForCausalLM` and the hybrid Qwen3.5/3.6 text model
(`Qwen3_5ForCausalLM`, or `Qwen3_5ForConditionalGeneration` with the text part under
`text_config`); everything the decoders need is derived here so the models never look at the raw dict.
"""

from __future__ import annotations

import functools
import json
import logging
import math
from dataclasses import dataclass
from pathlib import Path

from serving.contract.sizes import DeltaNetShape

# architecture name -> whether the attention applies RMSNorm to q and k per head
ARCHITECTURES = {"LlamaForCausalLM": False, "Qwen3ForCausalLM": True,
                 "Qwen3_5ForCausalLM": True, "Qwen3_5ForConditionalGeneration": True}
# hybrid Gated DeltaNet + gated attention (layer_types, zero-centred norms, partial rotary)
HYBRID = ("Qwen3_5ForCausalLM", "Qwen3_5ForConditionalGeneration")
LAYER_TYPES = ("linear_attention", "full_attention")
ROPE_TYPES = ("default", "linear", "llama3", "yarn")

log = logging.getLogger("serving.models")


class ModelError(ValueError):
    """A checkpoint problem, with a one-line message naming the file and key or tensor."""


@dataclass(frozen=True)
class RopeConfig:
    theta: float
    kind: str = "default"            # one of ROPE_TYPES
    factor: float = 1.0
    low_freq_factor: float = 1.0      # llama3 only
    high_freq_factor: float = 4.0     # llama3 only
    original_max_position: int = 8192  # llama3, yarn
    beta_fast: float = 32.0           # yarn: rotations above which a band is extrapolated
    beta_slow: float = 1.0            # yarn: rotations below which a band is interpolated
    truncate: bool = True             # yarn: round the ramp's band edges outwards
    attention_factor: float = 1.0     # yarn: cos and sin are scaled by this


@dataclass(frozen=True)
class LinearAttention:
    """Gated DeltaNet shapes: q/k heads of key_head_dim, v heads of value_head_dim, a short conv."""

    num_key_heads: int
    num_value_heads: int
    key_head_dim: int
    value_head_dim: int
    conv_kernel: int

    @functools.cached_property
    def shape(self) -> DeltaNetShape:
        """The same shapes as the contract's byte arithmetic reads them (serving.contract.sizes);
        built once, as every Gated DeltaNet layer's forward reads value_dim."""
        return DeltaNetShape(self.num_key_heads, self.num_value_heads, self.key_head_dim, self.value_head_dim,
                             self.conv_kernel)

    @property
    def conv_dim(self) -> int:
        """Channels through the causal conv: q | k | v."""
        return self.shape.conv_dim

    @property
    def value_dim(self) -> int:
        return self.shape.value_dim


@dataclass(frozen=True)
class ModelConfig:
    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    max_position_embeddings: int
    rope: RopeConfig
    tie_word_embeddings: bool
    qk_norm: bool
    attention_bias: bool
    torch_dtype: str                  # dtype the checkpoint declares ("float32", "bfloat16", ...)
    eos_token_ids: tuple[int, ...]
    bos_token_id: int | None
    layer_types: tuple[str, ...] = ()          # hybrids only: LAYER_TYPES per layer
    linear: LinearAttention | None = None      # hybrids only
    partial_rotary_factor: float = 1.0         # share of head_dim that RoPE rotates

    @property
    def kv_groups(self) -> int:
        return self.num_attention_heads // self.num_key_value_heads

    @property
    def hybrid(self) -> bool:
        return self.linear is not None

    @property
    def rotary_dim(self) -> int:
        return int(self.head_dim * self.partial_rotary_factor)

    @property
    def full_attention_layers(self) -> tuple[int, ...]:
        if not self.hybrid:
            return tuple(range(self.num_hidden_layers))
        return tuple(i for i, t in enumerate(self.layer_types) if t == "full_attention")

    @property
    def linear_layers(self) -> tuple[int, ...]:
        return tuple(i for i, t in enumerate(self.layer_types) if t == "linear_attention")


def read_model_config(model_dir: Path) -> ModelConfig:
    path = Path(model_dir) / "config.json"
    if not path.is_file():
        raise ModelError(f"{path}: missing file (an HF checkpoint needs config.json)")
    try:
        raw = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ModelError(f"{path}: not valid JSON ({e})") from None
    return parse_model_config(raw, str(path))


def parse_model_config(raw: dict, where: str = "config.json") -> ModelConfig:
    arch = _architecture(raw, where)
    if arch in HYBRID:
        raw = text_part(raw, where)
    _refuse_unsupported(raw, where)
    get = _getter(raw, where)
    heads = get("num_attention_heads", int)
    hidden = get("hidden_size", int)
    kv_heads = raw.get("num_key_value_heads") or heads
    if heads % kv_heads:
        raise ModelError(f"{where}: num_key_value_heads={kv_heads} does not divide num_attention_heads={heads}")
    head_dim = raw.get("head_dim") or hidden // heads
    return ModelConfig(
        architecture=arch,
        vocab_size=get("vocab_size", int),
        hidden_size=hidden,
        intermediate_size=get("intermediate_size", int),
        num_hidden_layers=get("num_hidden_layers", int),
        num_attention_heads=heads,
        num_key_value_heads=int(kv_heads),
        head_dim=int(head_dim),
        rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
        max_position_embeddings=int(raw.get("max_position_embeddings", 2048)),
        rope=read_rope(raw, where),
        tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
        qk_norm=ARCHITECTURES[arch],
        attention_bias=bool(raw.get("attention_bias", False)),
        torch_dtype=str(raw.get("torch_dtype") or raw.get("dtype") or "float32"),
        eos_token_ids=_ids(raw.get("eos_token_id")),
        bos_token_id=raw.get("bos_token_id"),
        **(_hybrid_fields(raw, where) if arch in HYBRID else {}),
    )


def text_part(raw: dict, where: str) -> dict:
    """The text model's keys: `text_config` over the top level (a vision tower is not served)."""
    text = raw.get("text_config")
    if text is None:
        return raw
    if not isinstance(text, dict):
        raise ModelError(f"{where}: text_config must be an object")
    if raw.get("vision_config") is not None:
        log.info("%s: vision_config present; serving the text model only (vision tower skipped)", where)
    outer = {k: v for k, v in raw.items() if k not in ("text_config", "vision_config")}
    return {**outer, **text}


def _hybrid_fields(raw: dict, where: str) -> dict:
    get = _getter(raw, where)
    layers = get("num_hidden_layers", int)
    types = raw.get("layer_types")
    if types is None:
        interval = int(raw.get("full_attention_interval", 4))
        types = ["full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(layers)]
    if len(types) != layers or any(t not in LAYER_TYPES for t in types):
        raise ModelError(f"{where}: layer_types must list {layers} entries from {', '.join(LAYER_TYPES)}")
    linear = LinearAttention(
        num_key_heads=get("linear_num_key_heads", int), num_value_heads=get("linear_num_value_heads", int),
        key_head_dim=get("linear_key_head_dim", int), value_head_dim=get("linear_value_head_dim", int),
        conv_kernel=get("linear_conv_kernel_dim", int))
    if linear.num_value_heads % linear.num_key_heads:
        raise ModelError(f"{where}: linear_num_key_heads={linear.num_key_heads} does not divide "
                         f"linear_num_value_heads={linear.num_value_heads}")
    params = raw.get("rope_parameters") or raw.get("rope_scaling") or {}
    factor = float(params.get("partial_rotary_factor", raw.get("partial_rotary_factor", 0.25)))
    return dict(layer_types=tuple(types), linear=linear, partial_rotary_factor=factor)


def _architecture(raw: dict, where: str) -> str:
    archs = raw.get("architectures") or []
    for arch in archs:
        if arch in ARCHITECTURES:
            return arch
    raise ModelError(f"{where}: architectures={archs!r} unsupported; "
                     f"supported: {', '.join(ARCHITECTURES)}")


def _refuse_unsupported(raw: dict, where: str) -> None:
    # features the decoder does not implement: loading anyway would give wrong logits silently
    if raw.get("hidden_act", "silu") != "silu":
        raise ModelError(f"{where}: hidden_act={raw['hidden_act']!r} unsupported (only 'silu')")
    if raw.get("mlp_bias"):
        raise ModelError(f"{where}: mlp_bias=true unsupported")
    if raw.get("use_sliding_window"):
        raise ModelError(f"{where}: use_sliding_window=true unsupported (full attention only)")


def _getter(raw: dict, where: str):
    def get(key: str, kind: type):
        if key not in raw:
            raise ModelError(f"{where}: missing key {key!r}")
        value = raw[key]
        if not isinstance(value, kind) or isinstance(value, bool) or value <= 0:
            raise ModelError(f"{where}: {key}={value!r} must be a positive {kind.__name__}")
        return value
    return get


def read_rope(raw: dict, where: str = "config.json") -> RopeConfig:
    """The RoPE facts of any config.json, target or draft (one reader for both).

    transformers v5 writes `rope_parameters` (theta inside); older files `rope_theta` +
    `rope_scaling` (`type` before `rope_type`). Unknown scaling kinds are refused: loading
    anyway would give wrong logits silently."""
    params = dict(raw.get("rope_scaling") or {})
    params.update(raw.get("rope_parameters") or {})
    theta = float(params.get("rope_theta", raw.get("rope_theta", 10000.0)))
    kind = params.get("rope_type", params.get("type", "default"))
    if kind not in ROPE_TYPES:
        raise ModelError(f"{where}: rope_scaling.rope_type={kind!r} unsupported; supported: {', '.join(ROPE_TYPES)}")
    factor = float(params.get("factor") or 1.0)
    default_original = 8192 if kind == "llama3" else raw.get("max_position_embeddings", 2048)
    original = int(params.get("original_max_position_embeddings") or default_original)
    if kind == "yarn" and params.get("factor") is None:
        factor = raw.get("max_position_embeddings", original) / original
    return RopeConfig(
        theta=theta, kind=kind, factor=factor,
        low_freq_factor=float(params.get("low_freq_factor", 1.0)),
        high_freq_factor=float(params.get("high_freq_factor", 4.0)),
        original_max_position=original,
        beta_fast=float(params.get("beta_fast") or 32.0),
        beta_slow=float(params.get("beta_slow") or 1.0),
        truncate=bool(params.get("truncate", True)),
        attention_factor=_yarn_attention_factor(params, factor) if kind == "yarn" else 1.0,
    )


def _yarn_attention_factor(params: dict, factor: float) -> float:
    # YaRN's "mscale": 0.1 ln(s) + 1, or a ratio of two such terms when both mscales are given
    if params.get("attention_factor") is not None:
        return float(params["attention_factor"])

    def mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0
    m, m_all = params.get("mscale"), params.get("mscale_all_dim")
    return mscale(factor, m) / mscale(factor, m_all) if m and m_all else mscale(factor)


def _ids(value) -> tuple[int, ...]:
    if value is None:
        return ()
    if isinstance(value, int):
        return (value,)
    return tuple(int(v) for v in value)
