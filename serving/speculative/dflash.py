"""The DFlash block-diffusion draft model and the drafter that runs it round by round.

Layout of the released drafts: config fields block_size, dflash_config.{mask_token_id,
target_layer_ids}, num_target_layers, layer_types / sliding_window / is_causal; weights
fc, hidden_norm, layers.N.*, norm. No embedding or lm_head: both come from the target.

Per layer, queries come from the block only; keys/values come from [context ; block]
through the same k_proj/v_proj ("KV injection"), where context = hidden_norm(fc(target
features)) of committed tokens. Context K/V are cached across rounds; block K/V never are.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from .base import Needs
from .preflight import PreflightError, check_captured, mask_token_id, target_layer_ids


@dataclass(frozen=True)
class DraftConfig:
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
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
            window = raw.get("sliding_window")
            heads = int(raw["num_attention_heads"])
            scaling = raw.get("rope_scaling")
            if scaling and scaling.get("rope_type", scaling.get("type")) not in (None, "default"):
                raise PreflightError(f"{source}: rope_scaling {scaling} is not supported by this drafter")
            return cls(
                hidden_size=int(raw["hidden_size"]),
                intermediate_size=int(raw["intermediate_size"]),
                num_layers=layers,
                num_heads=heads,
                num_kv_heads=int(raw.get("num_key_value_heads", heads)),
                head_dim=int(raw.get("head_dim") or int(raw["hidden_size"]) // heads),
                rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
                rope_theta=float(raw.get("rope_theta", 10000.0)),
                block_size=int(raw["block_size"]),
                mask_token_id=int(mask_token_id(raw)),
                target_layer_ids=tuple(target_layer_ids(raw)),
                vocab_size=int(raw["vocab_size"]),
                causal=tuple(bool(causal) if causal is not None else s for s in sliding),
                window=tuple(int(window) if s and window else None for s in sliding),
            )
        except (KeyError, TypeError) as err:
            raise PreflightError(f"{source}: draft config key {err} is missing or malformed") from None


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return (x32 * self.weight.float()).to(x.dtype)


def rope(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotate-half RoPE. x [b, heads, T, hd]; positions [T] or [b, T] (absolute)."""
    hd = x.shape[-1]
    inv = 1.0 / theta ** (torch.arange(0, hd, 2, device=x.device, dtype=torch.float32) / hd)
    freqs = positions.to(torch.float32)[..., None] * inv  # [(b,) T, hd/2]
    angles = torch.cat([freqs, freqs], -1)
    if angles.dim() == 3:
        angles = angles[:, None]  # per-sequence positions broadcast over heads
    half = hd // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], -1)
    return (x.float() * angles.cos() + rotated.float() * angles.sin()).to(x.dtype)


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


class DraftLayer(nn.Module):
    def __init__(self, cfg: DraftConfig, index: int):
        super().__init__()
        h, hd = cfg.hidden_size, cfg.head_dim
        self.cfg, self.causal, self.window = cfg, cfg.causal[index], cfg.window[index]
        self.input_layernorm = RMSNorm(h, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(h, cfg.rms_norm_eps)
        self.self_attn = nn.Module()
        self.self_attn.q_proj = nn.Linear(h, cfg.num_heads * hd, bias=False)
        self.self_attn.k_proj = nn.Linear(h, cfg.num_kv_heads * hd, bias=False)
        self.self_attn.v_proj = nn.Linear(h, cfg.num_kv_heads * hd, bias=False)
        self.self_attn.o_proj = nn.Linear(cfg.num_heads * hd, h, bias=False)
        self.self_attn.q_norm = RMSNorm(hd, cfg.rms_norm_eps)
        self.self_attn.k_norm = RMSNorm(hd, cfg.rms_norm_eps)
        self.mlp = nn.Module()
        self.mlp.gate_proj = nn.Linear(h, cfg.intermediate_size, bias=False)
        self.mlp.up_proj = nn.Linear(h, cfg.intermediate_size, bias=False)
        self.mlp.down_proj = nn.Linear(cfg.intermediate_size, h, bias=False)

    def _heads(self, x: torch.Tensor, proj: nn.Linear, norm: RMSNorm | None) -> torch.Tensor:
        b, t, _ = x.shape
        y = proj(x).view(b, t, -1, self.cfg.head_dim)
        return (norm(y) if norm is not None else y).transpose(1, 2)  # [b, heads, t, hd]

    def context_kv(self, ctx: torch.Tensor, ctx_pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """K/V of projected target features: ctx [b, C, H] -> 2 x [b, kv_heads, C, hd]."""
        attn = self.self_attn
        k = rope(self._heads(ctx, attn.k_proj, attn.k_norm), ctx_pos, self.cfg.rope_theta)
        return k, self._heads(ctx, attn.v_proj, None)

    def forward(self, x, x_pos, past_k, past_v, k_pos, mask=None):
        """x [b, B, H] block rows; past_k/v [b, kv, P, hd] context keys at k_pos [P].

        mask: bool [B, P+B] overriding the per-layer rule (training uses it).
        """
        attn, theta = self.self_attn, self.cfg.rope_theta
        h = self.input_layernorm(x)
        q = rope(self._heads(h, attn.q_proj, attn.q_norm), x_pos, theta)
        k = torch.cat([past_k, rope(self._heads(h, attn.k_proj, attn.k_norm), x_pos, theta)], 2)
        v = torch.cat([past_v, self._heads(h, attn.v_proj, None)], 2)
        if mask is None:
            mask = visible(x_pos, torch.cat([k_pos, x_pos]), self.causal, self.window)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
        x = x + attn.o_proj(out.transpose(1, 2).flatten(2))
        h = self.post_attention_layernorm(x)
        return x + self.mlp.down_proj(F.silu(self.mlp.gate_proj(h)) * self.mlp.up_proj(h))


class DFlashDraftModel(nn.Module):
    def __init__(self, cfg: DraftConfig):
        super().__init__()
        self.cfg = cfg
        self.fc = nn.Linear(cfg.feature_width, cfg.hidden_size, bias=False)
        self.hidden_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.layers = nn.ModuleList(DraftLayer(cfg, i) for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def project(self, features: torch.Tensor) -> torch.Tensor:
        """Target features [b, C, n_tap*H] -> context [b, C, H]."""
        return self.hidden_norm(self.fc(features))


class ContextCache:
    """Per draft layer, K/V of every committed token's context row: positions [0, length)."""

    def __init__(self, model: DFlashDraftModel):
        cfg = model.cfg
        p = next(model.parameters())
        empty = torch.empty(1, cfg.num_kv_heads, 0, cfg.head_dim, dtype=p.dtype, device=p.device)
        self.k = [empty] * cfg.num_layers
        self.v = [empty] * cfg.num_layers
        self.positions = torch.empty(0, dtype=torch.long, device=p.device)

    def append(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> None:
        self.k[layer] = torch.cat([self.k[layer], k], 2)
        self.v[layer] = torch.cat([self.v[layer], v], 2)


class DFlashDrafter:
    """Runs the draft model round by round against one target (batch size 1)."""

    def __init__(self, model: DFlashDraftModel, target, block_size: int | None = None):
        cfg = model.cfg
        self.model, self.target, self.cfg = model, target, cfg
        self.feature_width = model.fc.in_features
        # A block is the bonus plus block_size - 1 mask tokens; never wider than trained.
        block = min(block_size or cfg.block_size, cfg.block_size)
        self.needs = Needs(target_layers=cfg.target_layer_ids, draft_tokens=block)
        self.reset()

    def reset(self) -> None:
        self.cache = ContextCache(self.model)
        self.pending: list[tuple[torch.Tensor, torch.Tensor]] = []

    def extend(self, features: torch.Tensor, positions: torch.Tensor) -> None:
        """Target features [n, feature_width] of tokens committed at positions [n]."""
        check_captured(features.shape[-1], self.feature_width, len(self.cfg.target_layer_ids))
        self.pending.append((features, positions))

    @torch.inference_mode()
    def propose(self, bonus: int, start: int, depth: int) -> torch.Tensor:
        """Draft logits [depth, vocab] for positions start+1 .. start+depth."""
        model, cache, dev = self.model, self.cache, self.cache.positions.device
        if self.pending:
            features = torch.cat([f for f, _ in self.pending])  # [C, feature_width]
            ctx_pos = torch.cat([p for _, p in self.pending]).to(dev)  # [C]
            self.pending = []
            ctx = model.project(features.to(model.fc.weight.dtype)[None])
            for i, layer in enumerate(model.layers):
                cache.append(i, *layer.context_kv(ctx, ctx_pos))
            cache.positions = torch.cat([cache.positions, ctx_pos])
        block = torch.tensor([bonus] + [self.cfg.mask_token_id] * depth, device=dev)
        block_pos = torch.arange(start, start + depth + 1, device=dev)
        x = self.target.embed(block).to(model.fc.weight.dtype)[None]
        for i, layer in enumerate(model.layers):
            x = layer(x, block_pos, cache.k[i], cache.v[i], cache.positions)
        # lm_head over all block rows, row 0 dropped after: CPU BLAS is ~2.5x faster on the
        # 49k-vocab projection with 16 rows than with 15 (measured; multiples of 16 are fast)
        return self.target.lm_head(model.norm(x)[0])[1:]


def load_config(path: str | Path) -> DraftConfig:
    file = Path(path) / "config.json"
    try:
        raw = json.loads(file.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise PreflightError(f"{file}: cannot read draft config ({err})") from None
    return DraftConfig.from_dict(raw, str(file))


def load_model(path: str | Path, dtype: torch.dtype, device: str | torch.device) -> DFlashDraftModel:
    """Draft weights from model.safetensors; names must match the released layout exactly."""
    from safetensors.torch import load_file

    cfg = load_config(path)
    file = Path(path) / "model.safetensors"
    if not file.exists():
        raise PreflightError(f"{file}: no draft weights")
    weights = load_file(str(file))
    model = DFlashDraftModel(cfg)
    expected = model.state_dict()
    missing = sorted(set(expected) - set(weights))
    extra = sorted(set(weights) - set(expected))
    if missing or extra:
        raise PreflightError(f"{file}: weights do not match the DFlash layout (missing {missing[:3]}, unexpected {extra[:3]})")
    for name, tensor in weights.items():
        if tensor.shape != expected[name].shape:
            raise PreflightError(f"{file}: {name} has shape {tuple(tensor.shape)}, config implies {tuple(expected[name].shape)}")
    model.load_state_dict(weights)
    return model.to(device=device, dtype=dtype).eval()
