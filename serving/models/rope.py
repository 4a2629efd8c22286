"""Rotary position embedding tables (default, linear and llama3 frequency scaling)."""

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


def rope_tables(rope: RopeConfig, head_dim: int, positions: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin: [positions, head_dim] float32, halves repeated (HF rotate-half layout)."""
    angles = torch.outer(torch.arange(positions, dtype=torch.float32), inverse_frequencies(rope, head_dim))
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [T, heads, head_dim]; cos, sin [T, head_dim]."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos[:, None, :] + rotated * sin[:, None, :]
