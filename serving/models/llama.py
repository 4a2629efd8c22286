"""One decoder for LlamaForCausalLM and Qwen3ForCausalLM (Qwen3 = Llama + per-head q/k RMSNorm).

One forward, over the rows of many sequences packed back to back ([N] = sum of each sequence's
T_b rows: one decode token, a prefill chunk, or a speculative tree); one sequence is a batch of
one. Every projection, norm and MLP runs once over [N, hidden], no padding; attention runs per
sequence on its own KV cache with that sequence's own mask (none for one row, causal for a
chunk or a chain, the ancestor-only tree mask for a tree): the block-diagonal mask of the whole
batch without ever building it, so each row's attention numerics are its sequence's alone. A
plain decode step (one row each, caches of one pool) attends in one call per layer
(serving.models.decode_attention). q/k/v and gate/up projections are fused at load time (fewer
kernel launches per token). GQA attention keeps K/V unexpanded: the query heads of one KV head
are folded into the row axis, so the cache is read once per KV head.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention.bias import causal_lower_right

from serving.contract.runtime import compute_dtype, kv_dtype
from serving.kernels.linear_bf16 import is_blocked
from serving.kernels import rms_norm as native_norm
from serving.models.config import ModelConfig
from serving.models.cpu_gemm import PAD_ROWS, Linear, head, pack_matrices, small_rows
from serving.models.decode_attention import DecodeRows, NativeRows
from serving.models.kv_cache import KVCache
from serving.models.packing import row_slices
from serving.models.rope import apply_rope, rope_tables


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float, dtype: torch.dtype):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim, dtype=dtype))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.float32:     # a bf16 model's norm weights are widened at load (pack_weights)
            if native_norm.usable(x, self.weight):      # one native call where F.rms_norm runs several
                return native_norm.rms_norm(x, self.weight, self.eps)
            return F.rms_norm(x, self.weight.shape, self.weight, self.eps)
        # half precision: normalise in fp32, scale after casting back (as the HF reference does)
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)


class Attention(nn.Module):
    def __init__(self, c: ModelConfig, dtype: torch.dtype):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = c.num_attention_heads, c.num_key_value_heads, c.head_dim
        q_dim, kv_dim = self.heads * self.head_dim, self.kv_heads * self.head_dim
        self.qkv_proj = Linear(c.hidden_size, q_dim + 2 * kv_dim, bias=c.attention_bias, dtype=dtype)
        self.o_proj = Linear(q_dim, c.hidden_size, bias=False, dtype=dtype)
        self.q_norm = RMSNorm(self.head_dim, c.rms_norm_eps, dtype) if c.qk_norm else None
        self.k_norm = RMSNorm(self.head_dim, c.rms_norm_eps, dtype) if c.qk_norm else None

    def project(self, x, norm, cos, sin):
        """x [T, hidden], before `norm` -> q [T, heads, D], k and v [T, KV, D], q and k rotated."""
        T, H, KV, D = x.shape[0], self.heads, self.kv_heads, self.head_dim
        if self.q_norm is None:       # q and k side by side rotate with the product: H + KV heads
            qkv = self.qkv_proj.fused(x, norm, rope=(cos, sin, H + KV))          # [T, (H + 2 KV) * D]
            return qkv[:, :H * D].view(T, H, D), qkv[:, H * D:(H + KV) * D].view(T, KV, D), \
                qkv[:, (H + KV) * D:].view(T, KV, D)
        qkv = self.qkv_proj.fused(x, norm)
        v = qkv[:, (H + KV) * D:].view(T, KV, D)
        q, k = self.q_norm(qkv[:, :H * D].view(T, H, D)), self.k_norm(qkv[:, H * D:(H + KV) * D].view(T, KV, D))
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v

    def forward(self, x, norm, rows: PackedRows, layer: int):
        """x [N, hidden], the packed rows -> x + attention(norm(x)) [N, hidden]; each sequence's K/V
        written to its own cache."""
        q, k, v = self.project(x, norm, rows.cos, rows.sin)
        return self.o_proj.fused(self.attend(q, k, v, rows, layer), residual=x)

    def attend(self, q, k, v, rows: PackedRows, layer: int):
        """q [N, heads, D], k, v [N, KV, D] -> [N, heads * D]."""
        native = rows.native
        if native is not None and native.rows is None:          # every row: decode, chain or tree rows
            return native.attend(layer, q, k, v)
        if rows.decode is not None:
            return rows.decode.attend(layer, q, k, v)
        out = torch.empty(q.shape[0], self.heads * self.head_dim, dtype=q.dtype, device=q.device)
        if native is not None:                                  # beside long prompt chunks
            out[native.rows] = native.attend(layer, q[native.rows], k[native.rows], v[native.rows])
        for b, (cache, own, mask) in enumerate(zip(rows.caches, rows.slices, rows.masks)):
            if native is not None and b in native.sequences:
                continue
            keys, values = cache.write(layer, k[own].transpose(0, 1), v[own].transpose(0, 1))  # [KV, L, D]
            out[own] = attend(q[own], keys, values, mask)
        return out


def attend(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask) -> torch.Tensor:
    """q [T, heads, D] over keys/values [KV, L, D] (the last T are the new rows) -> [T, heads * D].

    mask: None, CAUSAL or a bool [G * T, L] from attention_mask."""
    T, heads, D = q.shape
    KV = keys.shape[0]
    G = heads // KV
    if mask is CAUSAL:
        # prefill chunk or chain verify: SDPA's own causal path (flash kernels apply), with
        # the diagonal aligned to the newest key when earlier chunks sit in the cache
        past = keys.shape[1] - T
        bias = None if past == 0 else causal_lower_right(T, past + T)
        out = F.scaled_dot_product_attention(q.transpose(0, 1)[None], keys[None], values[None],
                                             attn_mask=bias, is_causal=past == 0, enable_gqa=True)
        return out[0].transpose(0, 1).reshape(T, heads * D)
    # query head h = kv * G + g  ->  rows [1, KV, G * T, D], row g * T + t
    # (4-D inputs: the CPU flash kernel takes them; 3-D falls back to the slow math path)
    q = q.reshape(T, KV, G, D).permute(1, 2, 0, 3).reshape(1, KV, G * T, D)
    out = F.scaled_dot_product_attention(q, keys[None], values[None], attn_mask=mask)
    return out.view(KV, G, T, D).permute(2, 0, 1, 3).reshape(T, heads * D)


class MLP(nn.Module):
    def __init__(self, c: ModelConfig, dtype: torch.dtype):
        super().__init__()
        self.gate_up_proj = Linear(c.hidden_size, 2 * c.intermediate_size, bias=False, dtype=dtype)
        self.down_proj = Linear(c.intermediate_size, c.hidden_size, bias=False, dtype=dtype)

    def forward(self, x):
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(F.silu(gate) * up)

    def residual(self, x, norm):
        """x + forward(norm(x)): the norm and the residual inside the products where they fuse
        (cpu_gemm.Linear.fused)."""
        return self.down_proj.fused(self.gate_up_proj.fused(x, norm), swiglu=True, residual=x)


class DecoderLayer(nn.Module):
    def __init__(self, c: ModelConfig, dtype: torch.dtype):
        super().__init__()
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps, dtype)
        self.self_attn = Attention(c, dtype)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps, dtype)
        self.mlp = MLP(c, dtype)

    def forward(self, x, rows: PackedRows, layer: int):
        x = self.self_attn(x, self.input_layernorm, rows, layer)        # x + attention(norm(x))
        return self.mlp.residual(x, self.post_attention_layernorm)


@dataclass(frozen=True)
class PackedRows:
    """What every layer of one forward shares: the packed rows' RoPE and each sequence's part."""

    cos: torch.Tensor                   # [N, rotary_dim]
    sin: torch.Tensor
    caches: list[KVCache]               # caches[b]: sequence b's
    slices: list[slice]                 # sequence b's rows of the N
    masks: list                         # its attention_mask (None, CAUSAL or bool [G * T_b, L_b])
    native: NativeRows | None           # the rows the native kernel attends (decode, chain, tree rows)
    decode: DecodeRows | None           # a plain decode step without the kernel: one SDPA call per layer


class TargetLM(nn.Module):
    """What every target model shares around its layers: the token embedding, the final norm, the
    lm head (tied to the embedding or its own), the RoPE tables, dtype and device."""

    def __init__(self, config: ModelConfig, layers: nn.ModuleList, norm: nn.Module, rotary_dim: int,
                 dtype: torch.dtype):
        super().__init__()
        self.config = config
        self.rotary_dim = rotary_dim
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size, dtype=dtype)
        self.layers = layers
        self.norm = norm
        self.lm_head_weight = (self.embed_tokens.weight if config.tie_word_embeddings else
                               nn.Parameter(torch.empty(config.vocab_size, config.hidden_size, dtype=dtype)))
        self.cos = self.sin = None
        self.register_buffer("lm_head_packed", None, persistent=False)   # the head's oneDNN copy (pack_weights)
        self.head_min_rows = 1          # the head's products of fewer rows run padded (pack_weights)
        self.products: dict = {}        # how the products run, for /server_info kernels (pack_weights)

    @property
    def weight_dtype(self) -> torch.dtype:
        return self.embed_tokens.weight.dtype

    @property
    def dtype(self) -> torch.dtype:
        """The dtype it computes in: activations and the drafter (contract.runtime.compute_dtype)."""
        return self.dtype_by(compute_dtype)

    @property
    def kv_dtype(self) -> torch.dtype:
        """The dtype its K/V rows are kept in (contract.runtime.kv_dtype): bf16 rows widen to
        fp32 as attention reads them."""
        return self.dtype_by(kv_dtype)

    def dtype_by(self, rule) -> torch.dtype:
        """A contract.runtime dtype rule (device, weights' dtype, hybrid) -> name, for this target."""
        weights = str(self.weight_dtype).removeprefix("torch.")
        return getattr(torch, rule(self.device.type, weights, self.config.hybrid))

    @property
    def device(self) -> torch.device:
        return self.embed_tokens.weight.device

    def init_rope(self, positions: int) -> None:
        cos, sin = rope_tables(self.config.rope, self.rotary_dim, positions)
        self.cos, self.sin = cos.to(self.device, self.dtype), sin.to(self.device, self.dtype)

    def pack_weights(self) -> int:
        """After loading: the layers' projections in oneDNN's layout on CPU, and a packed copy of
        the head beside the dense one (serving.models.cpu_gemm); then whether products of fewer
        rows run faster padded on this CPU (measured: cpu_gemm.small_rows). Returns the layers packed."""
        linears = [m for m in self.modules() if isinstance(m, Linear)]      # in the order a forward reads them
        *layers, self.lm_head_packed = pack_matrices([m.weight for m in linears] + [self.lm_head_weight])
        for linear, packed in zip(linears, layers):   # the head's copy: a buffer, which serving.memory counts
            linear.take(packed)
        count = sum(m.packed for m in linears)
        for norm in (m for m in self.modules() if isinstance(m, RMSNorm)):   # [H] vectors: a few KB
            norm.weight.data = norm.weight.data.to(self.dtype)  # no cast per call when computing in fp32
        products = [(m.weight, m.bias, m.out_features, m.in_features) for m in self._packed_linears()]
        if self.lm_head_packed is not None:                     # the largest: measured first
            products.insert(0, (self.lm_head_packed, None, *self.lm_head_weight.shape))
        rows, ms = small_rows(products, self.dtype)
        self.pad_products(rows)
        if ms:
            kind = "bf16 blocked (serving/kernels/linear_bf16.c)" if is_blocked(products[0][0]) else "oneDNN packed"
            self.products = {"products": f"{kind}; fewer than {rows} rows padded to {rows}" if rows > 1 else kind,
                             "products_ms_1_vs_4_rows": [ms[1], ms[PAD_ROWS]]}
        return count

    def pad_products(self, rows: int) -> None:
        """Packed products of fewer than `rows` rows run padded to `rows` (1: never)."""
        for m in self._packed_linears():
            m.min_rows = rows
        self.head_min_rows = rows

    def _packed_linears(self) -> list[Linear]:
        return [m for m in self.modules() if isinstance(m, Linear) and m.packed]

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.embed_tokens(tokens).to(self.dtype)      # [T] -> [T, hidden]

    def lm_head(self, hidden: torch.Tensor) -> torch.Tensor:
        return head(hidden, self.lm_head_weight, self.lm_head_packed, self.head_min_rows).float()  # [T, hidden] -> [T, vocab] fp32


class CausalLM(TargetLM):
    """The target model of docs/contracts.md section 3."""

    def __init__(self, config: ModelConfig, dtype: torch.dtype = torch.float32):
        super().__init__(config, nn.ModuleList(DecoderLayer(config, dtype) for _ in range(config.num_hidden_layers)),
                         RMSNorm(config.hidden_size, config.rms_norm_eps, dtype), config.head_dim, dtype)

    def new_cache(self, capacity: int) -> KVCache:
        return KVCache.for_model(self.config, capacity, self.kv_dtype, self.device)

    def forward(self, tokens, positions, cache: KVCache, tree_mask=None, capture=(), last_only=False):
        """One sequence, a batch of one: tokens, positions [T]; returns logits [T or 1, vocab] fp32
        and hidden [T, len(capture) * H] or None."""
        return self.forward_packed(tokens, positions, [cache], [tokens.shape[0]], [tree_mask], capture, last_only)

    @torch.inference_mode()
    def forward_packed(self, tokens, positions, caches: list[KVCache], counts: list[int], tree_masks=None,
                       capture=(), last_only=False):
        """tokens, positions [N]: counts[b] rows of sequence b, in order; caches[b] its KV cache;
        tree_masks[b] a bool [T_b, T_b] ancestor mask, or None (causal rows).

        Writes each sequence's K/V at caches[b].length without committing. Returns logits
        [N, vocab] fp32 (last_only: [B, vocab], each sequence's last row) and hidden
        [N, len(capture) * H] or None.
        """
        x = self.embed(tokens)                                            # [N, hidden]
        groups, trees = self.config.kv_groups, tree_masks or [None] * len(caches)
        native = NativeRows.plan(caches, counts, trees, x.dtype, x.device)
        kernel_takes = native.sequences if native is not None else frozenset()
        masks = [None if b in kernel_takes else attention_mask(n, c.length, m, groups, x.device)
                 for b, (n, c, m) in enumerate(zip(counts, caches, trees))]
        one_row = native is None and all(n == 1 for n in counts) and all(m is None for m in trees)
        decode = DecodeRows.plan(caches, x.dtype, x.device) if one_row else None
        rows = PackedRows(self.cos.index_select(0, positions), self.sin.index_select(0, positions), caches,
                          row_slices(counts), masks, native, decode)
        captured = {}
        for i, layer in enumerate(self.layers):
            x = layer(x, rows, i)
            if i in capture:
                captured[i] = x
        hidden = torch.cat([captured[i] for i in capture], dim=-1) if capture else None
        if last_only:
            x = x.index_select(0, torch.tensor([r.stop - 1 for r in rows.slices], device=x.device))
        return self.lm_head(self.norm(x)), hidden

    def decode_step(self, tokens, positions, caches: list[KVCache], capture=()):
        """tokens, positions [B] (one new token per sequence) -> logits [B, vocab], hidden [B, ...] or None."""
        return self.forward_packed(tokens, positions, caches, [1] * len(caches), capture=capture)


CAUSAL = "causal"  # mask marker: plain causal attention over the cache and the new rows


def attention_mask(T: int, past: int, tree_mask, groups: int, device):
    """What a layer attends with: None (one new row sees every key), CAUSAL, or a bool mask
    [groups * T, past + T] (True = visible; row g * T + t is tree row t, for the query heads
    folded into the rows by `attend`) from a [T, T] tree mask.

    Built for each verify pass and dropped with it, like the pass's activations: a mask kept
    per sequence would be memory outside serving.memory's figures, growing with each new tree
    width. Building it costs one fill of its G x T x (past + T) bools per sequence and pass
    (CPU, 1 thread: 17 us at G 3, T 16, past 2048; 68 us at G 4, T 64, past 4096), noise beside
    the verify forward; the mask's values, so the outputs, are what a kept one held."""
    if tree_mask is None:
        return None if T == 1 else CAUSAL
    mask = torch.ones(groups * T, past + T, dtype=torch.bool, device=device)
    mask[:, past:] = tree_mask.repeat(groups, 1)
    return mask
