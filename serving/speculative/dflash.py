"""The DFlash drafter: one draft pass for every drafting sequence, and the draft loader.

Each sequence owns a `DraftContext`: its draft K/V (projected target features of its committed
tokens, slot = position) in a range of one preallocated draft pool (`DFlashDrafter.pool`), and
the features not yet projected. `absorb` projects the pending features of all sequences in one
pass; `propose` runs every sequence's block [bonus, MASK x depth_b] packed back to back
([N] = sum of depth_b + 1 rows) through the draft layers: projections and MLP once over
[1, N, H], and an `Attend` that runs each sequence's rows over its own context and block under
its own masks (`DFlashDraftModel.masks`), so blocks of different depths need no padding and
never see each other. A round writes its block's K/V after the context and never commits it,
so the next round overwrites it. A batch of one is a batch: the runner drafts one sequence
through the same pass.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from serving.contract.runtime import draft_projection_dtype
from serving.models.config import ModelError
from serving.models.kv_cache import KVCache
from serving.models.loader import TensorReader, tensor_files
from serving.models.packing import row_slices

from .base import Needs
from .draft_model import Attend, DFlashDraftModel, DraftConfig, attend_after, cached_store
from .preflight import PreflightError, check_captured
from .selector import BARE_NAMES

# Tensors a checkpoint may carry that are not weights (rotary tables saved by some exporters).
NON_WEIGHTS = ("inv_freq", "original_inv_freq")
# Optional file beside a draft: the token ids it may propose, most frequent first (FR-Spec).
DRAFT_VOCAB = "draft_vocab.json"


class DraftContext:
    """One sequence's draft context: K/V of `length` committed positions plus pending features.

    cache: its rows of the draft pool; a round writes its block after the context, so the
    context needs as many rows as the target's reservation (committed tokens + one verify pass)."""

    def __init__(self, cache: KVCache):
        self.cache = cache
        self.pending: list[torch.Tensor] = []          # [n, feature_width] each, in order
        self.trials: list = []                         # the adaptive controller's trees in flight (lane.py)
        self.chained: set[int] = set()                 # widths whose last trial round ended at the next root
        self.fresh = True                              # its first decoder round: where every width's run starts
        self.window, self.window_tokens = 0, 0         # the controller's window it is in, tokens since it opened

    @property
    def length(self) -> int:
        return self.cache.length

    @property
    def pending_rows(self) -> int:
        return sum(f.shape[0] for f in self.pending)


class DFlashDrafter:
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
        self.mask_id = cfg.mask_token_id
        self.vocab = None if vocab is None else torch.tensor(vocab, dtype=torch.long, device=self.device)
        # [V', H] rows of the target's LM head (a copy: a gather per round would cost as much);
        # the whole vocabulary shares the target's packed copy of it where the target keeps one
        # (serving.models.cpu_gemm.pack_matrices: 19 -> 5.7 ms for a block of 7 rows on one core)
        self.head = target.lm_head_weight if vocab is None else target.lm_head_weight[self.vocab].contiguous()
        self.head_packed = target.lm_head_packed if vocab is None else None    # None where not packed

    def pool(self, rows: int) -> KVCache:
        """The draft's K/V pool: `rows` rows over the draft's layers, allocated once."""
        cfg = self.cfg
        return KVCache(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, rows, self.model.dtype, self.device)

    @staticmethod
    def context(pool: KVCache, start: int, rows: int) -> DraftContext:
        """A new sequence's context over pool rows [start, start + rows)."""
        return DraftContext(pool.rows(start, rows))

    def extend(self, context: DraftContext, features: torch.Tensor) -> None:
        """Target features [n, feature_width] of the sequence's next n committed tokens."""
        check_captured(features.shape[-1], self.feature_width, len(self.cfg.target_layer_ids))
        context.pending.append(features)

    @torch.inference_mode()
    def absorb(self, contexts: list[DraftContext]) -> None:
        """Project every pending feature row and cache its K/V at the sequence's next positions."""
        contexts = [c for c in contexts if c.pending]
        if not contexts:
            return
        counts = [c.pending_rows for c in contexts]
        features = torch.cat([f for c in contexts for f in c.pending])        # [C, F]
        positions = torch.cat([torch.arange(c.length, c.length + n, device=self.device)
                               for c, n in zip(contexts, counts)])
        ctx = self.model.project(features[None])                               # [1, C, H]
        cos, sin = self.model.rotary(positions)
        for i, layer in enumerate(self.model.layers):
            k, v = layer.context_kv(ctx, cos, sin)                             # [1, KV, C, hd]
            for c, rows in zip(contexts, row_slices(counts)):
                c.cache.write(i, k[0, :, rows], v[0, :, rows])
        for c, n in zip(contexts, counts):
            c.cache.commit(n)
            c.pending = []

    @torch.inference_mode()
    def propose(self, contexts: list[DraftContext], bonuses: list[int], depths: list[int]) -> list:
        """Draft logits [depth_b, V'] per sequence for the positions after its bonus token
        (columns: `vocab`), or a selector draft's `Candidates` (DFlashDraftModel.proposals).
        Each block starts at its context's length (the bonus's position); depths are >= 1."""
        self.absorb(contexts)
        counts, starts = [d + 1 for d in depths], [c.length for c in contexts]
        slices, total = row_slices(counts), sum(counts)
        # tokens [N], positions [N] and the rows after each bonus [N - B], in one upload
        packed = torch.tensor([t for bonus, d in zip(bonuses, depths) for t in [bonus] + [self.mask_id] * d]
                              + [p for s, n in zip(starts, counts) for p in range(s, s + n)]
                              + [r for s in slices for r in range(s.start + 1, s.stop)]
                              + [i for n in counts for i in range(n)],
                              dtype=torch.long, device=self.device)
        tokens, positions, rows, offsets = packed.split([total, total, total - len(counts), total])
        keys = torch.arange(max(s + n for s, n in zip(starts, counts)), device=self.device)  # slot = position
        # [sequence][layer]: its block's visibility over its context and block, or None
        masks = [self.model.masks(positions[own], keys[:s + n]) for own, s, n in zip(slices, starts, counts)]
        cos, sin = self.model.rotary(positions)
        x = self.model.noise(self.target, tokens)[None]                         # [1, N, H]
        for i, layer in enumerate(self.model.layers):        # offsets: row index in its block (convs)
            x = layer(x, cos, sin, self._attend(i, contexts, slices, [m[i] for m in masks]), offsets)
        firsts = tokens[[s.start for s in slices]]                                # [B] the bonuses
        return self.model.proposals(self.model.norm(x[0])[rows], depths, firsts, self.head, self.vocab,
                                    self.head_packed)

    @staticmethod
    def _attend(i: int, contexts, slices: list[slice], masks) -> Attend:
        """Layer i's attention over packed block rows (q [1, heads, N, hd]): each sequence's
        rows see its own context and block only."""
        def attend(q, k, v):
            out = torch.empty_like(q)
            for rows, c, mask in zip(slices, contexts, masks):
                one = attend_after(cached_store(c.cache, i), mask)
                out[:, :, rows] = one(q[:, :, rows], k[:, :, rows], v[:, :, rows])
            return out
        return attend


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
        key = key + ".weight" if key in BARE_NAMES else key   # codebooks stored without `.weight`
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


def load_for(target, path: str | Path) -> DFlashDraftModel:
    """`load_model` for serving beside `target`: computing in the target's dtype, its projection
    matrices kept in the target's weights' (keep_projections)."""
    model = load_model(path, dtype=target.dtype, device=target.device)
    model.keep_projections(target.dtype_by(draft_projection_dtype))
    return model
