"""Write a tiny random HF checkpoint (Llama, Qwen3 or hybrid Qwen3.5) with a real, freshly trained BPE tokenizer.

    python -m serving.tools.tiny --arch llama|qwen3|qwen3_5 --out DIR [--dtype bfloat16] [--shards 2]

Deterministic: the same flags give the same bytes. Weights are scaled so greedy choices are
decisive (logit spread of several nats), which makes equality tests meaningful.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from serving.models.tokenizer import CHATML
from serving.tools.tiny_hybrid import hybrid_config, hybrid_weights

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CORPUS = """\
The capital of France is Paris. The capital of Italy is Rome. The capital of Spain is Madrid.
A speculative decoder drafts several tokens and the target model verifies them in one pass.
Block diffusion drafts a whole block at once; a tree of drafts lets the verifier keep the best path.
def fibonacci(n):
    if n < 2:
        return n
    return fibonacci(n - 1) + fibonacci(n - 2)
Numbers: 0 1 2 3 4 5 6 7 8 9 10 42 100 2024 3.14159.
The quick brown fox jumps over the lazy dog while the cat sleeps in the warm afternoon sun.
User: What is the capital of France? Assistant: The capital of France is Paris.
Servers listen on a port, answer health checks, and stream tokens to their clients.
"""
ARCH = {
    "llama": dict(architectures=["LlamaForCausalLM"], model_type="llama", hidden_size=64,
                  intermediate_size=192, num_hidden_layers=4, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=16, tie_word_embeddings=True, rope_theta=10000.0),
    "qwen3": dict(architectures=["Qwen3ForCausalLM"], model_type="qwen3", hidden_size=64,
                  intermediate_size=160, num_hidden_layers=4, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=32, tie_word_embeddings=False, rope_theta=1000000.0),
    "qwen3_5": {},   # hybrid Gated DeltaNet: serving.tools.tiny_hybrid
}
ROPE_SCALING = {
    "none": None,
    "linear": {"rope_type": "linear", "factor": 2.0},
    "llama3": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 64},
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16, "beta_fast": 8.0},
}


def train_tokenizer(vocab_size: int = 512) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS.splitlines(), trainer=trainer)
    return tok


def model_config(arch: str, vocab: int, dtype: str, rope_scaling: str, layers: int | None) -> dict:
    bos, eos = SPECIALS.index("<|im_start|>"), SPECIALS.index("<|im_end|>")
    if arch == "qwen3_5":
        return hybrid_config(vocab, dtype, layers, bos, eos)
    cfg = dict(ARCH[arch], vocab_size=vocab, max_position_embeddings=1024, rms_norm_eps=1e-6,
               hidden_act="silu", attention_bias=False, torch_dtype=dtype,
               bos_token_id=bos, eos_token_id=eos)
    if layers:
        cfg["num_hidden_layers"] = layers
    if ROPE_SCALING[rope_scaling]:
        cfg["rope_scaling"] = ROPE_SCALING[rope_scaling]
    return cfg


def random_weights(cfg: dict, seed: int) -> dict[str, torch.Tensor]:
    if "text_config" in cfg:
        return hybrid_weights(cfg, seed)
    g = torch.Generator().manual_seed(seed)
    H, I, D = cfg["hidden_size"], cfg["intermediate_size"], cfg["head_dim"]
    q, kv = cfg["num_attention_heads"] * D, cfg["num_key_value_heads"] * D

    def normal(*shape, std):
        return torch.randn(*shape, generator=g) * std

    def norm(n):
        return 1.0 + normal(n, std=0.1)

    w = {"model.embed_tokens.weight": normal(cfg["vocab_size"], H, std=0.5), "model.norm.weight": norm(H)}
    if not cfg["tie_word_embeddings"]:
        w["lm_head.weight"] = normal(cfg["vocab_size"], H, std=0.5)
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        w.update({p + "input_layernorm.weight": norm(H), p + "post_attention_layernorm.weight": norm(H),
                  p + "self_attn.q_proj.weight": normal(q, H, std=H ** -0.5),
                  p + "self_attn.k_proj.weight": normal(kv, H, std=H ** -0.5),
                  p + "self_attn.v_proj.weight": normal(kv, H, std=H ** -0.5),
                  p + "self_attn.o_proj.weight": normal(H, q, std=q ** -0.5),
                  p + "mlp.gate_proj.weight": normal(I, H, std=H ** -0.5),
                  p + "mlp.up_proj.weight": normal(I, H, std=H ** -0.5),
                  p + "mlp.down_proj.weight": normal(H, I, std=I ** -0.5)})
        if cfg["model_type"] == "qwen3":
            w[p + "self_attn.q_norm.weight"] = norm(D)
            w[p + "self_attn.k_norm.weight"] = norm(D)
    return w


def save_weights(weights: dict[str, torch.Tensor], out: Path, shards: int) -> None:
    names = sorted(weights)
    if shards <= 1:
        save_file({n: weights[n].contiguous() for n in names}, str(out / "model.safetensors"))
        return
    weight_map = {}
    for s in range(shards):
        file = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        part = names[s::shards]
        save_file({n: weights[n].contiguous() for n in part}, str(out / file))
        weight_map.update({n: file for n in part})
    index = {"metadata": {"total_size": sum(t.numel() * t.element_size() for t in weights.values())},
             "weight_map": weight_map}
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))


def write_tiny(out: Path, arch: str = "llama", dtype: str = "float32", shards: int = 1, seed: int = 0,
               rope_scaling: str = "none", layers: int | None = None) -> Path:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    tok = train_tokenizer()
    tok.save(str(out / "tokenizer.json"))
    settings = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": None, "eos_token": "<|im_end|>",
                "pad_token": "<|endoftext|>", "unk_token": "<|endoftext|>", "add_bos_token": False,
                "model_max_length": 1024, "chat_template": CHATML}
    (out / "tokenizer_config.json").write_text(json.dumps(settings, indent=2))
    cfg = model_config(arch, tok.get_vocab_size(), dtype, rope_scaling, layers)
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    weights = {n: t.to(getattr(torch, dtype)) for n, t in random_weights(cfg, seed).items()}
    save_weights(weights, out, shards)
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(prog="python -m serving.tools.tiny", description=__doc__.splitlines()[0])
    ap.add_argument("--arch", choices=sorted(ARCH), default="llama")
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default="float32")
    ap.add_argument("--shards", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--layers", type=int, default=None)
    ap.add_argument("--rope-scaling", choices=sorted(ROPE_SCALING), default="none")
    args = ap.parse_args(argv)
    out = write_tiny(args.out, args.arch, args.dtype, args.shards, args.seed, args.rope_scaling, args.layers)
    print(f"wrote {args.arch} tiny checkpoint to {out}")


if __name__ == "__main__":
    main()
