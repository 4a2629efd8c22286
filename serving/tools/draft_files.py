"""DFlash draft checkpoints in the released layout: the config a draft for a given target
needs, seeded random weights, and writing both. Shared by the tiny drafts (tiny_draft) and the
SmolLM2 drafter (train_draft), which sit above this module and never import each other's
pieces."""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
from safetensors.torch import save_file

TINY_LAYERS = 2
TINY_BLOCK = 8


def draft_config(target: dict, layers: int = TINY_LAYERS, block_size: int = TINY_BLOCK,
                 taps: list[int] | None = None, mask_token_id: int = 0, wide: bool = False) -> dict:
    """A DFlash config in the released layout, shaped to `target` (its config.json dict).

    wide: attention as wide as the residual stream (kv heads = heads, head_dim = 2H/heads),
    so a tiny draft can copy a token through one attention hop."""
    target = {**target, **(target.get("text_config") or {})}   # hybrids nest the text model
    n_target = target["num_hidden_layers"]
    taps = taps if taps is not None else sorted({min(n_target - 1, round(1 + i * (n_target - 2) / max(layers, 1)))
                                                  for i in range(layers)})
    heads = target["num_attention_heads"]
    return {
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        "block_size": block_size,
        "dflash_config": {"mask_token_id": mask_token_id, "target_layer_ids": taps},
        "num_target_layers": n_target,
        "num_hidden_layers": layers,
        "hidden_size": target["hidden_size"],
        "intermediate_size": (4 if wide else 2) * target["hidden_size"],
        "num_attention_heads": heads,
        "num_key_value_heads": heads if wide else target.get("num_key_value_heads", heads),
        "head_dim": 2 * target["hidden_size"] // heads if wide else
        target.get("head_dim") or target["hidden_size"] // heads,
        "hidden_act": "silu",
        "attention_bias": False,
        "rms_norm_eps": target.get("rms_norm_eps", 1e-6),
        "rope_theta": (target.get("rope_parameters") or {}).get("rope_theta", target.get("rope_theta", 10000.0)),
        "rope_scaling": None,
        "max_position_embeddings": target.get("max_position_embeddings", 2048),
        "vocab_size": target["vocab_size"],
        "tie_word_embeddings": False,
        "layer_types": ["full_attention"] * layers,
        "sliding_window": None,
        "use_sliding_window": False,
        "torch_dtype": "float32",
    }


# DFlash 2 fields (dflash_config) for the drafts we train: a conv over the block's last 3 rows
# in groups of 64 channels, the selector's 16 candidates re-scored at rank 64.
DFLASH2 = {"conv_kernel_size": 3, "conv_group_size": 64, "selector_rank": 64, "selector_top_k": 16}


def dflash2_config(config: dict, **fields) -> dict:
    """A DFlash 1 config (draft_config) as the DFlash 2 architecture: DFlash2DraftModel, its conv
    and selector fields (DFLASH2, overridden by `fields`) in dflash_config; conv_group_size must
    divide the hidden size."""
    extra = {**DFLASH2, **fields}
    extra["conv_group_size"] = math.gcd(int(extra["conv_group_size"]), int(config["hidden_size"]))
    return {**config, "architectures": ["DFlash2DraftModel"],
            "dflash_config": {**config["dflash_config"], "block_size": config["block_size"], **extra}}


def random_model(config: dict, seed: int):
    """A DFlashDraftModel with seeded weights (std 1/sqrt(fan_in), norms near 1)."""
    from serving.speculative.draft_model import DFlashDraftModel, DraftConfig

    torch.manual_seed(seed)  # nn.Linear init draws from the global generator
    model = DFlashDraftModel(DraftConfig.from_dict(config))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 2:
                p.copy_(torch.randn(p.shape, generator=g) * p.shape[1] ** -0.5)
            elif name.endswith("base_kernel"):  # [2, K, H]: near the identity (offset 0 ~ 1, the rest ~ 0)
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
                p[:, 0] += 1.0
            else:
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
    return model


def save_draft(model, config: dict, out: Path) -> Path:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().to(torch.float32).contiguous() for k, v in model.state_dict().items()}
    save_file(tensors, str(out / "model.safetensors"))
    (out / "model.safetensors").chmod(0o644)  # save_file writes 0600; services may run as another user
    (out / "config.json").write_text(json.dumps(config, indent=2))
    return out
