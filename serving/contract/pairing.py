"""Will this DFlash draft run on this target? Decided from the two config.json dicts alone
(plus, when weights are at hand, the real input width of the draft's fc).

The runtime runs these rules at start-up before weights load (serving/speculative/preflight.py)
and ddops runs the same ones on the host's files before changing anything (ddops/draft_pairing.py).
Every reason names both sides' numbers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from .drafts import DRAFTS, architecture, draft_arch, draft_value

TARGET_KEYS = ("hidden_size", "num_hidden_layers", "vocab_size")


@dataclass(frozen=True)
class Problem:
    key: str        # the config key at fault, e.g. "draft fc.weight"
    reason: str     # one line naming both sides

    def __str__(self) -> str:
        return f"{self.key}: {self.reason}"


def text_config(config: Mapping) -> Mapping:
    """Multimodal checkpoints (Qwen3.5/3.6) nest the language model's fields under text_config."""
    nested = config.get("text_config")
    return nested if "hidden_size" not in config and isinstance(nested, Mapping) else config


def derived_layer_ids(num_target_layers: int, num_draft_layers: int) -> list[int]:
    """Default taps when the draft config lists none: evenly spaced in [1, L-3]."""
    if num_draft_layers == 1:
        return [num_target_layers // 2]
    span = num_target_layers - 4
    return [round(1 + i * span / (num_draft_layers - 1)) for i in range(num_draft_layers)]


def target_layer_ids(draft: Mapping) -> list[int]:
    """dflash_config.target_layer_ids, else derived from num_target_layers (KeyError if absent)."""
    ids = (draft.get("dflash_config") or {}).get("target_layer_ids")
    if ids is not None:
        return [int(k) for k in ids]
    return derived_layer_ids(int(draft["num_target_layers"]), int(draft["num_hidden_layers"]))


def mask_token_id(draft: Mapping) -> int | None:
    value = (draft.get("dflash_config") or {}).get("mask_token_id")
    return None if value is None else int(value)


def problems(draft: Mapping, target: Mapping, block_size: int | None = None, budget: int | None = None,
             fc_in: int | None = None) -> list[Problem]:
    """Every mismatch between a DFlash draft config and a target config (empty: compatible).

    fc_in: the real input width of the draft's fc weight ([hidden, K * target hidden]) when known.
    """
    target = text_config(target)
    absent = [f"draft {k}" for k in ("hidden_size",) if k not in draft]
    absent += [f"target {k}" for k in TARGET_KEYS if k not in target]
    if absent:
        return [Problem(key, f"{key} is missing from config.json") for key in absent]
    if draft_arch(draft) is None:
        return [Problem("draft architectures", f"draft architecture {architecture(draft)} is not one the runtime "
                                               f"can build (known: {', '.join(DRAFTS)})")]
    try:
        taps = target_layer_ids(draft)
    except KeyError as err:
        return [Problem("draft dflash_config.target_layer_ids",
                        f"draft config has no dflash_config.target_layer_ids and no {err.args[0]} to derive them")]
    return (_width(draft, target, taps, fc_in) + _layers(draft, target, taps)
            + _vocab(draft, target) + _block(draft, block_size, budget) + _parts(draft, target))


def _width(draft: Mapping, target: Mapping, taps: list[int], fc_in: int | None) -> list[Problem]:
    n, draft_h, target_h = len(taps), int(draft["hidden_size"]), int(target["hidden_size"])
    expects = fc_in if fc_in is not None else n * draft_h
    provides = n * target_h
    found = []
    if expects != provides:
        per = f"{n} layers x {expects // n}" if n and expects % n == 0 else f"{n} layers"
        found.append(Problem("draft fc.weight" if fc_in is not None else "draft hidden_size",
                             f"draft expects {expects} = {per} but the target provides "
                             f"{n} x {target_h} = {provides}"))
    if draft_h != target_h:
        found.append(Problem("draft hidden_size", f"draft hidden_size {draft_h} but the target hidden_size is "
                                                  f"{target_h} (embeddings and lm_head are shared)"))
    return found


def _layers(draft: Mapping, target: Mapping, taps: list[int]) -> list[Problem]:
    layers = int(target["num_hidden_layers"])
    found = []
    missing = [k for k in taps if not 0 <= k < layers]
    if missing:
        found.append(Problem("draft dflash_config.target_layer_ids",
                             f"draft taps target layers {taps} but the target has layers 0..{layers - 1} "
                             f"({missing} missing)"))
    built_for = draft.get("num_target_layers")
    if built_for is not None and int(built_for) != layers:
        found.append(Problem("draft num_target_layers", f"draft was built for a {int(built_for)}-layer target "
                                                        f"but the target has {layers} layers"))
    return found


def _vocab(draft: Mapping, target: Mapping) -> list[Problem]:
    vocab = int(target["vocab_size"])
    found = []
    mask = mask_token_id(draft)
    if mask is None:
        found.append(Problem("draft dflash_config.mask_token_id", "draft dflash_config.mask_token_id is missing"))
    elif not 0 <= mask < vocab:
        found.append(Problem("draft dflash_config.mask_token_id",
                             f"draft mask_token_id {mask} does not fit the target vocabulary of {vocab}"))
    draft_vocab = draft.get("vocab_size")
    if draft_vocab is not None and int(draft_vocab) != vocab:
        rows = " (the rows of its selector's codebooks)" if draft_arch(draft).selector else ""
        found.append(Problem("draft vocab_size", f"draft vocab_size {int(draft_vocab)}{rows} but the target "
                                                 f"vocab_size is {vocab}"))
    return found


def _block(draft: Mapping, block_size: int | None, budget: int | None) -> list[Problem]:
    trained = draft_value(draft, "block_size")
    block = block_size if block_size is not None else trained
    if block is None:
        return [Problem("draft block_size", "draft block_size is missing and no "
                                            "--speculative-num-draft-tokens was given")]
    found = []
    if block < 2:
        found.append(Problem("block size", f"block size {block} leaves no draft tokens (needs >= 2)"))
    if trained is not None and block > int(trained):
        found.append(Problem("block size", f"block size {block} is larger than the draft's trained "
                                           f"block_size {int(trained)}"))
    if budget is not None and budget < 1:
        found.append(Problem("ddtree budget", f"ddtree budget {budget} must be >= 1"))
    return found


def _parts(draft: Mapping, target: Mapping) -> list[Problem]:
    """The architecture's own fields (serving/contract/drafts.py): convs and selector."""
    arch = draft_arch(draft)
    values = {key: draft_value(draft, key) for key in arch.keys}
    absent = [key for key, value in values.items() if value is None]
    if absent:
        return [Problem(f"draft dflash_config.{key}", f"{architecture(draft)} needs dflash_config.{key}, "
                                                      f"which config.json does not set") for key in absent]
    found = []
    hidden, vocab = int(draft["hidden_size"]), int(target["vocab_size"])
    if arch.convs:
        group, kernel = int(values["conv_group_size"]), int(values["conv_kernel_size"])
        if group < 1 or hidden % group:
            found.append(Problem("draft dflash_config.conv_group_size",
                                 f"conv_group_size {group} does not divide the draft hidden_size {hidden}"))
        if kernel < 1:
            found.append(Problem("draft dflash_config.conv_kernel_size", f"conv_kernel_size {kernel} must be >= 1"))
    if arch.selector:
        top_k, rank = int(values["selector_top_k"]), int(values["selector_rank"])
        if not 1 <= top_k <= vocab:
            found.append(Problem("draft dflash_config.selector_top_k",
                                 f"selector_top_k {top_k} must be in 1..{vocab} (the target vocabulary)"))
        if rank < 1:
            found.append(Problem("draft dflash_config.selector_rank", f"selector_rank {rank} must be >= 1"))
        if draft.get("vocab_size") is None:
            found.append(Problem("draft vocab_size", f"the selector's codebooks have vocab_size rows, and the "
                                                     f"draft config sets none (the target has {vocab})"))
    return found
