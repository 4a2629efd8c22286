"""KVCache: preallocated per-layer key/value storage for one sequence.

Slots [0, length) hold committed tokens. `model.forward` writes the K/V of T new tokens at
[length, length + T) without moving `length`; the caller then commits, either all of them
(`commit(T)`, plain decoding) or a tree path (`keep(path)`). Never reallocates while serving.
"""

from __future__ import annotations

import torch


class KVCache:
    pool: "KVCache | None" = None    # the cache this one is a row range of (`rows`), at `pool_start`
    pool_start = 0

    def __init__(self, num_layers: int, num_kv_heads: int, head_dim: int, capacity: int,
                 dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu"):
        # k[layer], v[layer]: [num_kv_heads, capacity, head_dim]; rows past `length` are never read
        shape = (num_layers, num_kv_heads, capacity, head_dim)
        self.k = torch.empty(shape, dtype=dtype, device=device)
        self.v = torch.empty(shape, dtype=dtype, device=device)
        self.capacity = capacity
        self.length = 0

    @classmethod
    def over(cls, k: torch.Tensor, v: torch.Tensor) -> "KVCache":
        """A cache over existing storage k, v [layers, kv_heads, capacity, head_dim] (a pool's slice)."""
        cache = cls.__new__(cls)
        cache.k, cache.v, cache.capacity, cache.length = k, v, k.shape[2], 0
        return cache

    def rows(self, start: int, count: int) -> "KVCache":
        """A cache over rows [start, start + count) of this one's storage (a pool's loan), empty."""
        view = KVCache.over(self.k[:, :, start:start + count], self.v[:, :, start:start + count])
        view.pool, view.pool_start = self, start
        return view

    def kv_bytes(self) -> int:
        """Bytes of its K and V storage (a pool's: all its rows)."""
        return sum(t.numel() * t.element_size() for t in (self.k, self.v))

    @staticmethod
    def dims(config) -> tuple[int, int, int]:
        """(layers, kv heads, head_dim) of a model's K/V: its full-attention layers (all of a
        dense model's; a hybrid's linear-attention layers keep a recurrent state instead)."""
        return len(config.full_attention_layers), config.num_key_value_heads, config.head_dim

    @classmethod
    def for_model(cls, config, capacity: int, dtype: torch.dtype, device) -> "KVCache":
        return cls(*cls.dims(config), capacity, dtype, device)

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store k, v [kv_heads, T, head_dim] at [length, length+T); return [0, length+T) in k's
        dtype: views, or, where the rows are kept in another (bf16 rows of an fp32 model:
        contract.runtime.kv_dtype), copies of what was stored, so every reader sees the same bits."""
        end = self.length + k.shape[1]
        if end > self.capacity:
            raise ValueError(f"KV cache full: {end} tokens > capacity {self.capacity}")
        self.k[layer, :, self.length:end] = k
        self.v[layer, :, self.length:end] = v
        keys, values = self.k[layer, :, :end], self.v[layer, :, :end]
        return (keys, values) if keys.dtype == k.dtype else (keys.to(k.dtype), values.to(v.dtype))

    def commit(self, count: int) -> None:
        """Accept the `count` rows just written after `length` (plain decoding)."""
        self.length += count

    def keep(self, path) -> None:
        """Accept the new rows at `path` (indices relative to `length`, ascending), moved to the front."""
        idx = torch.as_tensor(path, dtype=torch.long, device=self.k.device) + self.length
        n = idx.numel()
        dst = slice(self.length, self.length + n)
        self.k[:, :, dst] = self.k[:, :, idx]     # advanced indexing copies first, so overlap is safe
        self.v[:, :, dst] = self.v[:, :, idx]
        self.length += n

    def truncate(self, length: int) -> None:
        """Forget everything after `length` (rollback, or reuse for a new sequence with 0)."""
        if not 0 <= length <= self.length:
            raise ValueError(f"cannot truncate KV cache of length {self.length} to {length}")
        self.length = length
