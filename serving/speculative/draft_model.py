"""The DFlash block-diffusion draft model in the released layout.

Config fields: block_size, dflash_config.{mask_token_id, target_layer_ids}, num_target_layers,
layer_types / sliding_window / is_causal, RoPE as any config.json spells it (the target's
reader, `serving.models.config.read_rope`). Weights: fc, hidden_norm, layers.N.*, norm. No
embedding or lm_head: both come from the target. RMSNorm and RoPE are the target's own.

Per layer, queries come from the block only; keys/values come from [context ; block]
through the same k_proj/v_proj ("KV injection"), where context = hidden_norm(fc(target
features)) of committed tokens.

Sliding-window layers: we follow z-lab's `dflash` package (the oracle of
tests/speculative/test_draft_oracle.py). A layer is causal when the config says `is_causal`;
without that key, exactly the `sliding_attention` layers are causal. A window W keeps keys
with query_pos - key_pos < W, and, on a non-causal layer, key_pos - query_pos < W too; W is
`sliding_window` when `use_sliding_window` is true (transformers' Qwen3Config, which the package
loads drafts with, drops the window otherwise). Released sliding-window drafts (Qwen3.6-27B-DFlash) ship no `is_causal` and were trained
under this rule, so any other reading would change their logits.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from serving.models.config import ModelError, RopeConfig, read_rope
from serving.models.llama import RMSNorm
from serving.models.rope import apply_rope, cos_sin, inverse_frequencies

from .base import PreflightError
from .preflight import mask_token_id, target_layer_ids


@dataclass(frozen=True)
class DraftConfig:
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope: RopeConfig
    block_size: int
    mask_token_id: int
    target_layer_ids: tuple[int, ...]
    vocab_size: int
    causal: tuple[bool, ...]  # per layer: block rows see only keys at positions <= theirs
    window: tuple[int | None, ...]  # per layer: sliding window in positions, None = unbounded

    @property
    def feature_width(self) -> int:
        return len(self.target_layer_ids) * self.hidden_size

    @classmethod
    def from_dict(cls, raw: dict, source: str = "config.json") -> DraftConfig:
        try:
            layers = int(raw["num_hidden_layers"])
            types = raw.get("layer_types") or ["full_attention"] * layers
            sliding = [t == "sliding_attention" for t in types]
            causal = raw.get("is_causal")
            # as transformers' Qwen3Config reads it: the window counts only with use_sliding_window
            window = raw.get("sliding_window") if raw.get("use_sliding_window") else None
            heads = int(raw["num_attention_heads"])
            return cls(
                hidden_size=int(raw["hidden_size"]),
                intermediate_size=int(raw["intermediate_size"]),
                num_layers=layers,
                num_heads=heads,
                num_kv_heads=int(raw.get("num_key_value_heads") or heads),
                head_dim=int(raw.get("head_dim") or int(raw["hidden_size"]) // heads),
                rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
                rope=read_rope(raw, source),
                block_size=int(raw["block_size"]),
                mask_token_id=int(mask_token_id(raw)),
                target_layer_ids=tuple(target_layer_ids(raw)),
                vocab_size=int(raw["vocab_size"]),
                causal=tuple(bool(causal) if causal is not None else s for s in sliding),
                window=tuple(int(window) if s and window else None for s in sliding),
            )
        except ModelError as err:
            raise PreflightError(str(err)) from None
        except (KeyError, TypeError) as err:
            raise PreflightError(f"{source}: draft config key {err} is missing or malformed") from None


def visible(q_pos: torch.Tensor, k_pos: torch.Tensor, causal: bool, window: int | None) -> torch.Tensor | None:
    """Bool [..., Tq, Tk] by absolute position, or None when everything is visible."""
    if not causal and window is None:
        return None
    gap = q_pos[..., :, None] - k_pos[..., None, :]  # query minus key position
    ok = torch.ones_like(gap, dtype=torch.bool)
    if causal:
        ok &= gap >= 0
    if window is not None:
        ok &= gap < window
        if not causal:
            ok &= -gap < window
    return ok


# (k, v) of the block rows [b, kv_heads, B, hd] -> keys and values to attend to, context first
KeyStore = Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]
# (q [b, heads, B, hd], k, v [b, kv_heads, B, hd]) of the block rows -> attention output like q
Attend = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def attend_after(store: KeyStore, mask: torch.Tensor | None) -> Attend:
    """Block rows attend to the keys `store` puts the context before; mask: bool
    [(b, 1,) B, keys] (True = visible) or None for all keys."""
    def attend(q, k, v):
        keys, values = store(k, v)
        return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, enable_gqa=True)
    return attend


def cached_store(cache, layer: int) -> KeyStore:
    """A batch-1 store over a context KVCache: writes the block's K/V after the committed
    context (uncommitted, so the next round overwrites them) and returns both."""
    def store(k, v):
        keys, values = cache.write(layer, k[0], v[0])
        return keys[None], values[None]
    return store


class DraftLayer(nn.Module):
    def __init__(self, cfg: DraftConfig, index: int):
        super().__init__()
        h, hd, eps = cfg.hidden_size, cfg.head_dim, cfg.rms_norm_eps
        self.cfg, self.causal, self.window = cfg, cfg.causal[index], cfg.window[index]
        self.input_layernorm = RMSNorm(h, eps, torch.float32)
        self.post_attention_layernorm = RMSNorm(h, eps, torch.float32)
        self.self_attn = nn.Module()
        self.self_attn.q_proj = nn.Linear(h, cfg.num_heads * hd, bias=False)
        self.self_attn.k_proj = nn.Linear(h, cfg.num_kv_heads * hd, bias=False)
        self.self_attn.v_proj = nn.Linear(h, cfg.num_kv_heads * hd, bias=False)
        self.self_attn.o_proj = nn.Linear(cfg.num_heads * hd, h, bias=False)
        self.self_attn.q_norm = RMSNorm(hd, eps, torch.float32)
        self.self_attn.k_norm = RMSNorm(hd, eps, torch.float32)
        self.mlp = nn.Module()
        self.mlp.gate_proj = nn.Linear(h, cfg.intermediate_size, bias=False)
        self.mlp.up_proj = nn.Linear(h, cfg.intermediate_size, bias=False)
        self.mlp.down_proj = nn.Linear(cfg.intermediate_size, h, bias=False)

    def _heads(self, x, proj: nn.Linear, norm: RMSNorm | None, cos=None, sin=None) -> torch.Tensor:
        """x [b, t, H] -> [b, heads, t, hd], q/k-normed and rotated when given norm and cos/sin."""
        b, t, _ = x.shape
        y = proj(x).view(b, t, -1, self.cfg.head_dim)
        if norm is not None:
            y = apply_rope(norm(y), cos, sin)
        return y.transpose(1, 2)

    def context_kv(self, ctx: torch.Tensor, cos, sin) -> tuple[torch.Tensor, torch.Tensor]:
        """K/V of projected target features: ctx [b, C, H] -> 2 x [b, kv_heads, C, hd]."""
        attn = self.self_attn
        return self._heads(ctx, attn.k_proj, attn.k_norm, cos, sin), self._heads(ctx, attn.v_proj, None)

    def forward(self, x: torch.Tensor, cos, sin, attend: Attend) -> torch.Tensor:
        """x [b, B, H] block rows with cos/sin [(b,) B, hd]; `attend` adds the context keys
        and applies the mask (`attend_after`, or the batched drafter's per-sequence form)."""
        attn = self.self_attn
        h = self.input_layernorm(x)
        q = self._heads(h, attn.q_proj, attn.q_norm, cos, sin)
        out = attend(q, self._heads(h, attn.k_proj, attn.k_norm, cos, sin), self._heads(h, attn.v_proj, None))
        x = x + attn.o_proj(out.transpose(1, 2).flatten(2))
        h = self.post_attention_layernorm(x)
        return x + self.mlp.down_proj(F.silu(self.mlp.gate_proj(h)) * self.mlp.up_proj(h))


class DFlashDraftModel(nn.Module):
    def __init__(self, cfg: DraftConfig):
        super().__init__()
        self.cfg = cfg
        self.fc = nn.Linear(cfg.feature_width, cfg.hidden_size, bias=False)
        self.hidden_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, torch.float32)
        self.layers = nn.ModuleList(DraftLayer(cfg, i) for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, torch.float32)
        self.inv_freq = inverse_frequencies(cfg.rope, cfg.head_dim)  # not a buffer: stays fp32

    @property
    def dtype(self) -> torch.dtype:
        return self.fc.weight.dtype

    def project(self, features: torch.Tensor) -> torch.Tensor:
        """Target features [b, C, n_tap*H] -> context [b, C, H]."""
        return self.hidden_norm(self.fc(features.to(self.dtype)))

    def masks(self, q_pos: torch.Tensor, k_pos: torch.Tensor) -> list[torch.Tensor | None]:
        """Per layer, `visible(q_pos, k_pos)` under its rule; built once per distinct rule
        (causal, window), since layers share a handful of them."""
        rules = list(zip(self.cfg.causal, self.cfg.window))
        built = {rule: visible(q_pos, k_pos, *rule) for rule in set(rules)}
        return [built[rule] for rule in rules]

    def rotary(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """positions [(b,) T] -> cos, sin [(b,) T, hd] in the model's dtype."""
        if self.inv_freq.device != positions.device:
            self.inv_freq = self.inv_freq.to(positions.device)
        cos, sin = cos_sin(self.cfg.rope, self.inv_freq, positions)
        return cos.to(self.dtype), sin.to(self.dtype)
