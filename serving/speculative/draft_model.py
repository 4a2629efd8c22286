"""The DFlash block-diffusion draft model in the released layout.

Config fields: block_size, dflash_config.{mask_token_id, target_layer_ids}, num_target_layers,
layer_types / sliding_window / is_causal, RoPE as any config.json spells it (the target's
reader, `serving.models.config.read_rope`), and the optional output_multiplier,
final_logit_softcapping and input_embedding_scale. Weights: fc, hidden_norm, layers.N.*, norm. No
embedding or lm_head: both come from the target. RMSNorm and RoPE are the target's own.
What the architecture adds is read from serving/contract/drafts.py (DRAFTS): with convs, each
layer's attention_conv / mlp_conv (serving/speculative/dflash2_model.py, DFlash 2); with a
selector, candidate_selector (serving/speculative/selector.py), and `proposals` returns its
`Candidates` instead of logits.

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

from serving.contract.drafts import DEFAULT_ARCH, DRAFTS, DraftArch, architecture, draft_arch, draft_value, output_scale
from serving.models import cpu_gemm
from serving.models.config import ModelError, RopeConfig, read_rope
from serving.models.llama import RMSNorm
from serving.models.rope import apply_rope, cos_sin, inverse_frequencies

from .base import PreflightError
from .dflash2_model import GroupedDynamicCausalConv, mixed_after, mixed_before
from .preflight import mask_token_id, target_layer_ids
from .selector import Candidates, CandidateSelector


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
    arch: DraftArch = DRAFTS[DEFAULT_ARCH]
    output_multiplier: float = 1.0
    softcap: float | None = None  # final_logit_softcapping: logits = c * tanh(logits / c)
    embedding_scale: float = 1.0  # input_embedding_scale: noise rows = target embedding * scale
    conv_kernel: int = 0  # convs: conv_kernel_size, rows each conv looks back + 1
    conv_group: int = 0  # convs: conv_group_size, channels per dynamic-kernel group
    selector_rank: int = 0
    selector_top_k: int = 0

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
            arch = draft_arch(raw)
            if arch is None:
                raise PreflightError(f"{source}: draft architecture {architecture(raw)} is not one the "
                                     f"runtime can build (known: {', '.join(DRAFTS)})")
            absent = [key for key in arch.keys if draft_value(raw, key) is None]
            if absent:
                raise PreflightError(f"{source}: {architecture(raw)} needs dflash_config.{absent[0]}")
            need = {key: int(draft_value(raw, key)) for key in arch.keys}
            multiplier, softcap, scale = output_scale(raw)
            return cls(
                hidden_size=int(raw["hidden_size"]),
                intermediate_size=int(raw["intermediate_size"]),
                num_layers=layers,
                num_heads=heads,
                num_kv_heads=int(raw.get("num_key_value_heads") or heads),
                head_dim=int(raw.get("head_dim") or int(raw["hidden_size"]) // heads),
                rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
                rope=read_rope(raw, source),
                block_size=int(draft_value(raw, "block_size")),
                mask_token_id=int(mask_token_id(raw)),
                target_layer_ids=tuple(target_layer_ids(raw)),
                vocab_size=int(raw["vocab_size"]),
                causal=tuple(bool(causal) if causal is not None else s for s in sliding),
                window=tuple(int(window) if s and window else None for s in sliding),
                arch=arch, output_multiplier=multiplier, softcap=softcap, embedding_scale=scale,
                conv_kernel=need.get("conv_kernel_size", 0), conv_group=need.get("conv_group_size", 0),
                selector_rank=need.get("selector_rank", 0), selector_top_k=need.get("selector_top_k", 0),
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
        self.self_attn.q_proj = cpu_gemm.Linear(h, cfg.num_heads * hd, bias=False)
        self.self_attn.k_proj = cpu_gemm.Linear(h, cfg.num_kv_heads * hd, bias=False)
        self.self_attn.v_proj = cpu_gemm.Linear(h, cfg.num_kv_heads * hd, bias=False)
        self.self_attn.o_proj = cpu_gemm.Linear(cfg.num_heads * hd, h, bias=False)
        self.self_attn.q_norm = RMSNorm(hd, eps, torch.float32)
        self.self_attn.k_norm = RMSNorm(hd, eps, torch.float32)
        self.mlp = nn.Module()
        self.mlp.gate_proj = cpu_gemm.Linear(h, cfg.intermediate_size, bias=False)
        self.mlp.up_proj = cpu_gemm.Linear(h, cfg.intermediate_size, bias=False)
        self.mlp.down_proj = cpu_gemm.Linear(cfg.intermediate_size, h, bias=False)
        convs = cfg.arch.convs
        self.attention_conv = GroupedDynamicCausalConv(h, cfg.conv_kernel, cfg.conv_group) if convs else None
        self.mlp_conv = GroupedDynamicCausalConv(h, cfg.conv_kernel, cfg.conv_group) if convs else None

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

    def forward(self, x: torch.Tensor, cos, sin, attend: Attend, offsets: torch.Tensor | None = None) -> torch.Tensor:
        """x [b, B, H] block rows with cos/sin [(b,) B, hd]; `attend` adds the context keys
        and applies the mask (`attend_after`, or the batched drafter's per-sequence form).
        offsets [B]: each row's index in its own block when several are packed along B (the
        convs never mix blocks); None: each batch row is one block."""
        attn = self.self_attn
        h, kernel = mixed_before(self.attention_conv, self.input_layernorm(x), offsets)
        q = self._heads(h, attn.q_proj, attn.q_norm, cos, sin)
        out = attend(q, self._heads(h, attn.k_proj, attn.k_norm, cos, sin), self._heads(h, attn.v_proj, None))
        x = x + mixed_after(self.attention_conv, attn.o_proj(out.transpose(1, 2).flatten(2)), kernel, offsets)
        h, kernel = mixed_before(self.mlp_conv, self.post_attention_layernorm(x), offsets)
        mlp = self.mlp.down_proj(F.silu(self.mlp.gate_proj(h)) * self.mlp.up_proj(h))
        return x + mixed_after(self.mlp_conv, mlp, kernel, offsets)


class DFlashDraftModel(nn.Module):
    def __init__(self, cfg: DraftConfig):
        super().__init__()
        self.cfg = cfg
        self.fc = cpu_gemm.Linear(cfg.feature_width, cfg.hidden_size, bias=False)
        self.hidden_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, torch.float32)
        self.layers = nn.ModuleList(DraftLayer(cfg, i) for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, torch.float32)
        self.inv_freq = inverse_frequencies(cfg.rope, cfg.head_dim)  # not a buffer: stays fp32
        self.candidate_selector = (CandidateSelector(cfg.vocab_size, cfg.hidden_size, cfg.selector_rank,
                                                     cfg.selector_top_k) if cfg.arch.selector else None)

    @property
    def dtype(self) -> torch.dtype:
        """The dtype it computes in (its norms', whatever its projections are kept in)."""
        return self.norm.weight.dtype

    def keep_projections(self, dtype: torch.dtype) -> int:
        """For serving: fc and the layers' projection matrices kept in `dtype`, the target's
        weights' (contract.runtime.draft_projection_dtype). Where it computes in fp32 over bf16
        weights they are packed for the target's bf16 products (cpu_gemm.pack_matrices; fp32
        rows in and out). Training never calls it. Returns the matrices packed."""
        linears = [m for m in self.modules() if isinstance(m, cpu_gemm.Linear)]   # in forward order
        if dtype == self.dtype:
            return 0
        weights = [m.weight.detach().to(dtype) for m in linears]
        packed = cpu_gemm.pack_matrices(weights) if self.dtype == torch.float32 else [None] * len(weights)
        for linear, weight, done in zip(linears, weights, packed):
            if done is None:        # not packed here: the dense matrix in `dtype` (cpu_gemm.Linear casts rows)
                linear.weight = nn.Parameter(weight, requires_grad=False)
            linear.take(done)
        return sum(m.packed for m in linears)

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

    def noise(self, target, tokens: torch.Tensor) -> torch.Tensor:
        """Block input rows: the target's embedding of tokens [..] -> [.., H], times
        input_embedding_scale, in the draft's dtype."""
        x = target.embed(tokens).to(self.dtype)
        return x if self.cfg.embedding_scale == 1.0 else x * self.cfg.embedding_scale

    def logits(self, hidden: torch.Tensor, head: torch.Tensor, packed: torch.Tensor | None = None) -> torch.Tensor:
        """Normed hidden [.., H] through the head rows [V', H] (`packed`: their oneDNN copy, if
        kept) -> [.., V'] fp32, with the draft's output_multiplier and final_logit_softcapping.
        Training's hidden carries gradients, which cpu_gemm.head sends through F.linear."""
        out = cpu_gemm.head(hidden, head, packed).float()
        if self.cfg.output_multiplier != 1.0:
            out = out * self.cfg.output_multiplier
        cap = self.cfg.softcap
        return out if cap is None else torch.tanh(out / cap) * cap

    def proposals(self, hidden: torch.Tensor, depths: list[int], bonuses: torch.Tensor, head: torch.Tensor,
                  vocab: torch.Tensor | None = None, packed: torch.Tensor | None = None,
                  ) -> list[torch.Tensor] | list[Candidates]:
        """Packed blocks' rows after their bonus, normed hidden [sum(depths), H], bonuses [B] long ->
        per block what its verifier plans from: logits [depth_b, V'], or with a selector its
        Candidates (token ids and pairwise scores)."""
        logits = self.logits(hidden, head, packed).split(depths)
        if self.candidate_selector is None:
            return list(logits)
        return [self.candidate_selector.candidates(h, z, b, vocab)
                for h, z, b in zip(hidden.split(depths), logits, bonuses)]
