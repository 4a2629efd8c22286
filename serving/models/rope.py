"""Rotary position embedding (default, linear, llama3 and YaRN frequency scaling).

One implementation for the target and the draft: both read `RopeConfig` (config.read_rope)
and rotate with `apply_rope`.
"""

from __future__ import annotations

import math

import torch

from serving.models.config import RopeConfig


def inverse_frequencies(rope: RopeConfig, head_dim: int) -> torch.Tensor:
    """[head_dim // 2] float32 angular frequencies, after the configured scaling."""
    inv = 1.0 / (rope.theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
    if rope.kind == "linear":
        inv = inv / rope.factor
    elif rope.kind == "llama3":
        inv = _llama3_scale(inv, rope)
    elif rope.kind == "yarn":
        inv = _yarn_scale(inv, rope, head_dim)
    return inv.float()


def _llama3_scale(inv: torch.Tensor, rope: RopeConfig) -> torch.Tensor:
    # long wavelengths are slowed by `factor`, short ones kept, the band between interpolated
    wavelen = 2 * math.pi / inv
    low_wavelen = rope.original_max_position / rope.low_freq_factor
    high_wavelen = rope.original_max_position / rope.high_freq_factor
    smooth = (rope.original_max_position / wavelen - rope.low_freq_factor) / (
        rope.high_freq_factor - rope.low_freq_factor)
    blended = (1 - smooth) * inv / rope.factor + smooth * inv
    out = torch.where(wavelen > low_wavelen, inv / rope.factor, inv)
    middle = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(middle, blended, out)


def _yarn_scale(inv: torch.Tensor, rope: RopeConfig, head_dim: int) -> torch.Tensor:
    # dimensions turning more than beta_fast times over the original context keep their
    # frequency, those turning fewer than beta_slow times are slowed by `factor`, a linear
    # ramp blends the band between (YaRN, arXiv 2309.00071)
    def dim_at(rotations: float) -> float:
        return head_dim * math.log(rope.original_max_position / (rotations * 2 * math.pi)) / (2 * math.log(rope.theta))

    low, high = dim_at(rope.beta_fast), dim_at(rope.beta_slow)
    if rope.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, head_dim - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(head_dim // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
    return inv / rope.factor * ramp + inv * (1 - ramp)


def cos_sin(rope: RopeConfig, inv: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """positions [...] -> cos, sin [..., head_dim] float32, halves repeated (rotate-half layout).

    inv: inverse_frequencies(rope, head_dim) on the positions' device."""
    angles = positions.to(torch.float32)[..., None] * inv
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos() * rope.attention_factor, angles.sin() * rope.attention_factor


def rope_tables(rope: RopeConfig, head_dim: int, positions: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin: [positions, head_dim] float32 for positions 0 .. positions-1."""
    return cos_sin(rope, inverse_frequencies(rope, head_dim), torch.arange(positions))


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [..., T, heads, head_dim]; cos, sin [..., T, head_dim] (shared by the heads)."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos.unsqueeze(-2) + rotated * sin.unsqueeze(-2)
