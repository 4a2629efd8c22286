"""The DFlash drafter: runs the draft model round by round, and loads released drafts.

Context K/V (projected target features of committed tokens) live in a preallocated
KVCache per draft layer, slot = absolute position; a round writes the block's K/V after
them and never commits it, so the next round overwrites it.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.nn.functional as F

from serving.models.config import ModelError
from serving.models.kv_cache import KVCache
from serving.models.loader import TensorReader, tensor_files

from .base import Needs
from .draft_model import DFlashDraftModel, DraftConfig, attend_after, cached_store
from .preflight import PreflightError, check_captured

# Tensors a checkpoint may carry that are not weights (rotary tables saved by some exporters).
NON_WEIGHTS = ("inv_freq", "original_inv_freq")
# Optional file beside a draft: the token ids it may propose, most frequent first (FR-Spec).
DRAFT_VOCAB = "draft_vocab.json"


class DFlashDrafter:
    """Runs the draft model round by round against one target (batch size 1)."""

    def __init__(self, model: DFlashDraftModel, target, block_size: int | None = None,
                 vocab: list[int] | None = None):
        """vocab: token ids the draft may propose (a reduced vocabulary: its LM head is that
        many rows of the target's); None: all. The target still verifies every token, so
        output is unchanged, only which drafts are proposed."""
        cfg = model.cfg
        self.model, self.target, self.cfg = model, target, cfg
        self.feature_width = model.fc.in_features
        # A block is the bonus plus block_size - 1 mask tokens; never wider than trained.
        block = min(block_size or cfg.block_size, cfg.block_size)
        self.needs = Needs(target_layers=cfg.target_layer_ids, draft_tokens=block)
        self.device = model.fc.weight.device
        self.mask_ids = torch.full((cfg.block_size,), cfg.mask_token_id, dtype=torch.long, device=self.device)
        self.cache: KVCache | None = None
        self.vocab = None if vocab is None else torch.tensor(vocab, dtype=torch.long, device=self.device)
        # [V', H] rows of the target's LM head (a copy: a gather per round would cost as much)
        self.head = target.lm_head_weight if vocab is None else target.lm_head_weight[self.vocab].contiguous()
        self.reset()

    def batch(self):
        """The batched form (serving.speculative.dflash_batch): one draft pass for many sequences."""
        from .dflash_batch import BatchDrafter

        return BatchDrafter(self)

    def reserve(self, capacity: int) -> None:
        """Allocate room for `capacity` positions (context plus one block), keeping the rows."""
        if self.cache is not None and self.cache.capacity >= capacity:
            return
        cfg, old = self.cfg, self.cache
        self.cache = KVCache(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, capacity, self.model.dtype, self.device)
        if old is not None and old.length:
            self.cache.k[:, :, : old.length] = old.k[:, :, : old.length]
            self.cache.v[:, :, : old.length] = old.v[:, :, : old.length]
            self.cache.length = old.length

    def reset(self) -> None:
        if self.cache is not None:
            self.cache.truncate(0)
        self.pending: list[torch.Tensor] = []

    def extend(self, features: torch.Tensor) -> None:
        """Target features [n, feature_width] of the next n committed tokens, in order."""
        check_captured(features.shape[-1], self.feature_width, len(self.cfg.target_layer_ids))
        self.pending.append(features)

    @property
    def length(self) -> int:
        """Positions whose context K/V are cached (features still pending not counted)."""
        return self.cache.length if self.cache is not None else 0

    def _absorb(self, extra: int) -> None:
        """Project the pending features and cache their K/V at the next positions."""
        features = self.pending[0] if len(self.pending) == 1 else torch.cat(self.pending)  # [C, F]
        self.pending = []
        start, count = self.length, features.shape[0]
        if self.cache is None or self.cache.capacity < start + count + extra:
            self.reserve(max(2 * start, start + count + extra))   # grows only past what is reserved
        ctx = self.model.project(features[None])  # [1, C, H]
        cos, sin = self.model.rotary(torch.arange(start, start + count, device=self.device))
        for i, layer in enumerate(self.model.layers):
            k, v = layer.context_kv(ctx, cos, sin)
            self.cache.write(i, k[0], v[0])
        self.cache.commit(count)

    @torch.inference_mode()
    def propose(self, bonus: int | torch.Tensor, start: int, depth: int) -> torch.Tensor:
        """Draft logits [depth, vocab] for positions start+1 .. start+depth.

        bonus: the token at `start` (an int, or a [1] long tensor already on the device)."""
        if self.pending:
            self._absorb(depth + 1)
        self.reserve(start + depth + 1)
        if self.length != start:
            raise ValueError(f"draft context holds {self.length} positions, the block starts at {start}")
        bonus = torch.tensor([bonus], device=self.device) if isinstance(bonus, int) else bonus.view(1)
        block = torch.cat([bonus, self.mask_ids[:depth]])  # [B] = bonus, MASK x depth
        positions = torch.arange(start, start + depth + 1, device=self.device)
        keys = torch.arange(start + depth + 1, device=self.device)  # slot = position
        masks = self.model.masks(positions, keys)
        cos, sin = self.model.rotary(positions)
        x = self.target.embed(block).to(self.model.dtype)[None]  # [1, B, H]
        for i, (layer, mask) in enumerate(zip(self.model.layers, masks)):
            x = layer(x, cos, sin, attend_after(cached_store(self.cache, i), mask))
        # LM head over the block rows after the bonus: [depth, V'] fp32
        return F.linear(self.model.norm(x)[0, 1:], self.head).float()


def load_vocab(path: str | Path, vocab_size: int) -> list[int] | None:
    """The draft's reduced vocabulary (draft_vocab.json: {"token_ids": [...]}) or None."""
    file = Path(path) / DRAFT_VOCAB
    if not file.is_file():
        return None
    try:
        ids = [int(t) for t in json.loads(file.read_text())["token_ids"]]
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise PreflightError(f"{file}: unreadable draft vocabulary ({err})") from None
    bad = [t for t in ids if not 0 <= t < vocab_size]
    if bad or not ids or len(set(ids)) != len(ids):
        raise PreflightError(f"{file}: token_ids must be distinct ids below {vocab_size} (bad: {bad[:3]})")
    return ids


def load_config(path: str | Path) -> DraftConfig:
    file = Path(path) / "config.json"
    try:
        raw = json.loads(file.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise PreflightError(f"{file}: cannot read draft config ({err})") from None
    return DraftConfig.from_dict(raw, str(file))


def _weight_names(files: dict[str, Path], expected: dict) -> dict[str, str]:
    """Our parameter name -> checkpoint name; `model.` prefixes accepted, buffers skipped."""
    names = {}
    for name, file in files.items():
        key = name.removeprefix("model.")
        if key in expected:
            names[key] = name
        elif key.rsplit(".", 1)[-1] not in NON_WEIGHTS:
            raise PreflightError(f"{file}: unexpected tensor {name} (not part of the DFlash draft layout)")
    missing = sorted(set(expected) - set(names))
    if missing:
        raise PreflightError(f"{next(iter(files.values()))}: missing draft tensor(s) {', '.join(missing[:3])}")
    return names


def load_model(path: str | Path, dtype: torch.dtype, device: str | torch.device) -> DFlashDraftModel:
    """A released draft: model.safetensors or a sharded index; names checked exactly."""
    cfg = load_config(path)
    try:
        files = tensor_files(Path(path))
    except ModelError as err:
        raise PreflightError(f"no draft weights: {err}") from None
    model = DFlashDraftModel(cfg)
    expected = model.state_dict()
    names = _weight_names(files, expected)
    weights = {}
    with TensorReader(files) as read:
        for key, name in names.items():
            tensor = read(name)
            if tensor.shape != expected[key].shape:
                raise PreflightError(f"{files[name]}: {name} has shape {tuple(tensor.shape)}, "
                                     f"config implies {tuple(expected[key].shape)}")
            weights[key] = tensor.float()
    model.load_state_dict(weights)
    return model.to(device=device, dtype=dtype).eval()
