"""The HF tensor layout of Qwen3.5/3.6 text models, and filling a HybridLM from it.

`Qwen3_5ForCausalLM` names the text model `model.*`; `Qwen3_5ForConditionalGeneration`
names it `model.language_model.*` beside `model.visual.*` (not loaded). `mtp.*` (the
multi-token-prediction head) is not loaded either. lm_head is always `lm_head.weight`.
"""

from __future__ import annotations

import logging

import torch

from serving.models.config import ModelConfig

PREFIXES = ("model.language_model.", "model.")
SKIPPED = ("model.visual.", "mtp.")

log = logging.getLogger("serving.models")


def text_prefix(names) -> str:
    """Where the text model's tensors live in this checkpoint."""
    names = set(names)
    for prefix in PREFIXES:
        if prefix + "embed_tokens.weight" in names:
            return prefix
    return PREFIXES[-1]


def log_skipped(names) -> None:
    for skipped in SKIPPED:
        count = sum(1 for n in names if n.startswith(skipped))
        if count:
            log.info("not loading %d tensors under %s (text model only)", count, skipped)


def expected_tensors(c: ModelConfig, prefix: str) -> dict[str, tuple[int, ...]]:
    H, D, I, L = c.hidden_size, c.head_dim, c.intermediate_size, c.linear
    q, kv = c.num_attention_heads * D, c.num_key_value_heads * D
    out = {prefix + "embed_tokens.weight": (c.vocab_size, H), prefix + "norm.weight": (H,)}
    if not c.tie_word_embeddings:
        out["lm_head.weight"] = (c.vocab_size, H)
    for i, kind in enumerate(c.layer_types):
        p = f"{prefix}layers.{i}."
        out.update({p + "input_layernorm.weight": (H,), p + "post_attention_layernorm.weight": (H,),
                    p + "mlp.gate_proj.weight": (I, H), p + "mlp.up_proj.weight": (I, H),
                    p + "mlp.down_proj.weight": (H, I)})
        if kind == "full_attention":
            a = p + "self_attn."
            out.update({a + "q_proj.weight": (2 * q, H), a + "k_proj.weight": (kv, H),
                        a + "v_proj.weight": (kv, H), a + "o_proj.weight": (H, q),
                        a + "q_norm.weight": (D,), a + "k_norm.weight": (D,)})
        else:
            g, Hv = p + "linear_attn.", L.num_value_heads
            out.update({g + "in_proj_qkv.weight": (L.conv_dim, H), g + "in_proj_z.weight": (L.value_dim, H),
                        g + "in_proj_b.weight": (Hv, H), g + "in_proj_a.weight": (Hv, H),
                        g + "conv1d.weight": (L.conv_dim, 1, L.conv_kernel), g + "A_log": (Hv,),
                        g + "dt_bias": (Hv,), g + "norm.weight": (L.value_head_dim,),
                        g + "out_proj.weight": (H, L.value_dim)})
    return out


def fill(model, c: ModelConfig, read, prefix: str) -> None:
    model.embed_tokens.weight.copy_(read(prefix + "embed_tokens.weight"))
    model.norm.weight.copy_(read(prefix + "norm.weight"))
    if not c.tie_word_embeddings:
        model.lm_head_weight.copy_(read("lm_head.weight"))
    for i, layer in enumerate(model.layers):
        p = f"{prefix}layers.{i}."
        layer.input_layernorm.weight.copy_(read(p + "input_layernorm.weight"))
        layer.post_attention_layernorm.weight.copy_(read(p + "post_attention_layernorm.weight"))
        layer.mlp.gate_up_proj.weight.copy_(torch.cat([read(p + "mlp.gate_proj.weight"),
                                                       read(p + "mlp.up_proj.weight")]))
        layer.mlp.down_proj.weight.copy_(read(p + "mlp.down_proj.weight"))
        if layer.linear:
            _fill_linear(layer.linear_attn, read, p + "linear_attn.")
        else:
            _fill_attention(layer.self_attn, read, p + "self_attn.")


def _fill_attention(attn, read, a: str) -> None:
    attn.qkv_proj.weight.copy_(torch.cat([read(a + f"{n}_proj.weight") for n in "qkv"]))
    attn.o_proj.weight.copy_(read(a + "o_proj.weight"))
    attn.q_norm.weight.copy_(read(a + "q_norm.weight"))
    attn.k_norm.weight.copy_(read(a + "k_norm.weight"))


def _fill_linear(gdn, read, g: str) -> None:
    gdn.in_proj.weight.copy_(torch.cat([read(g + f"in_proj_{n}.weight") for n in ("qkv", "z", "b", "a")]))
    gdn.conv_weight.copy_(read(g + "conv1d.weight")[:, 0, :])
    gdn.A_log.copy_(read(g + "A_log"))
    gdn.dt_bias.copy_(read(g + "dt_bias"))
    gdn.norm.weight.copy_(read(g + "norm.weight"))
    gdn.out_proj.weight.copy_(read(g + "out_proj.weight"))
