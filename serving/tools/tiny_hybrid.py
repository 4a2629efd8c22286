"""The tiny hybrid (Qwen3.5/3.6 layout) checkpoint behind `python -m serving.tools.tiny --arch qwen3_5`.

Published layout: `Qwen3_5ForConditionalGeneration` with the text model under `text_config`
and its tensors under `model.language_model.*` (no vision tower). Three Gated DeltaNet layers
per gated full-attention layer, 2 key / 4 value heads with dk != dv (so a head-repeat or a
state-transpose mistake shows), partial rotary 0.25. Tied embeddings (unlike the 27B) make
greedy text settle into runs a tiny draft can learn, like the dense tiny targets.
"""

from __future__ import annotations

import torch

PREFIX = "model.language_model."
TEXT = dict(model_type="qwen3_5_text", hidden_size=64, intermediate_size=160, num_hidden_layers=4,
            num_attention_heads=4, num_key_value_heads=2, head_dim=16, full_attention_interval=4,
            linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
            linear_value_head_dim=8, linear_conv_kernel_dim=4, tie_word_embeddings=True,
            attention_bias=False, hidden_act="silu", rms_norm_eps=1e-6, max_position_embeddings=1024,
            rope_parameters={"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25})


def hybrid_config(vocab: int, dtype: str, layers: int | None, bos: int, eos: int) -> dict:
    text = dict(TEXT, vocab_size=vocab, dtype=dtype, bos_token_id=bos, eos_token_id=eos)
    if layers:
        text["num_hidden_layers"] = layers
    n = text["num_hidden_layers"]
    text["layer_types"] = ["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(n)]
    return {"architectures": ["Qwen3_5ForConditionalGeneration"], "model_type": "qwen3_5",
            "tie_word_embeddings": True, "eos_token_id": eos, "text_config": text}


def hybrid_weights(cfg: dict, seed: int) -> dict[str, torch.Tensor]:
    c = cfg["text_config"]
    g = torch.Generator().manual_seed(seed)
    H, I, D = c["hidden_size"], c["intermediate_size"], c["head_dim"]

    def normal(*shape, std):
        return torch.randn(*shape, generator=g) * std

    def linear(rows, cols):
        return normal(rows, cols, std=cols ** -0.5)

    w = {PREFIX + "embed_tokens.weight": normal(c["vocab_size"], H, std=0.5),
         PREFIX + "norm.weight": normal(H, std=0.1)}                      # zero-centred: y = x(1 + w)
    if not c["tie_word_embeddings"]:
        w["lm_head.weight"] = normal(c["vocab_size"], H, std=0.5)
    for i, kind in enumerate(c["layer_types"]):
        p = f"{PREFIX}layers.{i}."
        w.update({p + "input_layernorm.weight": normal(H, std=0.1),
                  p + "post_attention_layernorm.weight": normal(H, std=0.1),
                  p + "mlp.gate_proj.weight": linear(I, H), p + "mlp.up_proj.weight": linear(I, H),
                  p + "mlp.down_proj.weight": linear(H, I)})
        w.update(_attention(c, p + "self_attn.", linear, normal) if kind == "full_attention"
                 else _deltanet(c, p + "linear_attn.", linear, normal, g))
    return w


def _attention(c: dict, a: str, linear, normal) -> dict:
    H, D = c["hidden_size"], c["head_dim"]
    q, kv = c["num_attention_heads"] * D, c["num_key_value_heads"] * D
    return {a + "q_proj.weight": linear(2 * q, H), a + "k_proj.weight": linear(kv, H),
            a + "v_proj.weight": linear(kv, H), a + "o_proj.weight": linear(H, q),
            a + "q_norm.weight": normal(D, std=0.1), a + "k_norm.weight": normal(D, std=0.1)}


def _deltanet(c: dict, p: str, linear, normal, g) -> dict:
    H, K = c["hidden_size"], c["linear_conv_kernel_dim"]
    Hv, dv = c["linear_num_value_heads"], c["linear_value_head_dim"]
    conv = 2 * c["linear_num_key_heads"] * c["linear_key_head_dim"] + Hv * dv
    return {p + "in_proj_qkv.weight": linear(conv, H), p + "in_proj_z.weight": linear(Hv * dv, H),
            p + "in_proj_b.weight": linear(Hv, H), p + "in_proj_a.weight": linear(Hv, H),
            p + "conv1d.weight": normal(conv, 1, K, std=K ** -0.5),
            # decay rates spread like the HF init (A in [1, 16)), so heads remember for different spans
            p + "A_log": (1 + 15 * torch.rand(Hv, generator=g)).log(), p + "dt_bias": normal(Hv, std=0.5),
            p + "norm.weight": 1.0 + normal(dv, std=0.1), p + "out_proj.weight": linear(H, Hv * dv)}
