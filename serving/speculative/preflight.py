"""Will this draft run on this target? Decided from the two config.json dicts alone.

Stdlib only, so it runs without torch or weights (`python -m serving.speculative.preflight
DRAFT_DIR TARGET_DIR`, locally or on a host over SSH). Every message names both sides.
The same rules run at start-up before weights load; the captured width is checked
again at the first forward (`check_captured`).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Mapping

from .base import PreflightError


def derived_layer_ids(num_target_layers: int, num_draft_layers: int) -> list[int]:
    """Default taps when the draft config lists none: evenly spaced in [1, L-3]."""
    if num_draft_layers == 1:
        return [num_target_layers // 2]
    span = num_target_layers - 4
    return [round(1 + i * span / (num_draft_layers - 1)) for i in range(num_draft_layers)]


def target_layer_ids(draft: Mapping) -> list[int]:
    ids = (draft.get("dflash_config") or {}).get("target_layer_ids")
    if ids is not None:
        return [int(k) for k in ids]
    return derived_layer_ids(int(draft["num_target_layers"]), int(draft["num_hidden_layers"]))


def mask_token_id(draft: Mapping) -> int | None:
    value = (draft.get("dflash_config") or {}).get("mask_token_id")
    return None if value is None else int(value)


def _width_problem(draft: Mapping, target: Mapping, taps: list[int], fc_in: int | None) -> list[str]:
    n, draft_h, target_h = len(taps), int(draft["hidden_size"]), int(target["hidden_size"])
    expects = fc_in if fc_in is not None else n * draft_h
    provides = n * target_h
    problems = []
    if expects != provides:
        per = f"{n} layers x {expects // n}" if expects % n == 0 else f"{n} layers"
        problems.append(f"draft expects {expects} = {per} but the target provides {n} x {target_h} = {provides}")
    if draft_h != target_h:
        problems.append(f"draft hidden_size {draft_h} but the target hidden_size is {target_h} (embeddings and lm_head are shared)")
    return problems


def _layer_problems(draft: Mapping, target: Mapping, taps: list[int]) -> list[str]:
    layers = int(target["num_hidden_layers"])
    problems = []
    missing = [k for k in taps if not 0 <= k < layers]
    if missing:
        problems.append(f"draft taps target layers {taps} but the target has layers 0..{layers - 1} ({missing} missing)")
    built_for = draft.get("num_target_layers")
    if built_for is not None and int(built_for) != layers:
        problems.append(f"draft was built for a {int(built_for)}-layer target but the target has {layers} layers")
    return problems


def _vocab_problems(draft: Mapping, target: Mapping) -> list[str]:
    vocab = int(target["vocab_size"])
    problems = []
    mask = mask_token_id(draft)
    if mask is None:
        problems.append("draft dflash_config.mask_token_id is missing")
    elif not 0 <= mask < vocab:
        problems.append(f"draft mask_token_id {mask} does not fit the target vocabulary of {vocab}")
    draft_vocab = draft.get("vocab_size")
    if draft_vocab is not None and int(draft_vocab) != vocab:
        problems.append(f"draft vocab_size {int(draft_vocab)} but the target vocab_size is {vocab}")
    return problems


def _block_problems(draft: Mapping, block_size: int | None, budget: int | None) -> list[str]:
    trained = draft.get("block_size")
    block = block_size if block_size is not None else trained
    problems = []
    if block is None:
        return ["draft block_size is missing and no --speculative-num-draft-tokens was given"]
    if block < 2:
        problems.append(f"block size {block} leaves no draft tokens (needs >= 2)")
    if trained is not None and block > int(trained):
        problems.append(f"block size {block} is larger than the draft's trained block_size {int(trained)}")
    if budget is not None and budget < 1:
        problems.append(f"ddtree budget {budget} must be >= 1")
    return problems


def problems(draft: Mapping, target: Mapping, block_size: int | None = None, budget: int | None = None,
             fc_in: int | None = None) -> list[str]:
    """Every mismatch between a DFlash draft config and a target config (empty: compatible).

    fc_in: the real input width of the draft's fc weight when weights are at hand.
    """
    for side, config, keys in (("draft", draft, ("hidden_size",)),
                               ("target", target, ("hidden_size", "num_hidden_layers", "vocab_size"))):
        absent = [k for k in keys if k not in config]
        if absent:
            return [f"{side} config lacks {', '.join(absent)}"]
    try:
        taps = target_layer_ids(draft)
    except KeyError as err:
        return [f"draft config has no dflash_config.target_layer_ids and no {err.args[0]} to derive them"]
    return (_width_problem(draft, target, taps, fc_in) + _layer_problems(draft, target, taps)
            + _vocab_problems(draft, target) + _block_problems(draft, block_size, budget))


def check(draft: Mapping, target: Mapping, **kw) -> None:
    found = problems(draft, target, **kw)
    if found:
        raise PreflightError("; ".join(found))


def check_captured(width: int, expected: int, taps: int) -> None:
    """Runtime guard at the first forward: the bug class this product exists to end."""
    if width != expected:
        per = expected // taps if taps else 0
        raise PreflightError(f"draft expects {expected} = {taps} layers x {per} but the target "
                             f"captured {width} features per token")


def read_config(path: str | Path) -> dict:
    """config.json of a checkpoint directory (or the file itself); one-line errors."""
    path = Path(path)
    file = path / "config.json" if path.is_dir() else path
    try:
        return json.loads(file.read_text())
    except FileNotFoundError:
        raise PreflightError(f"{file}: no such file") from None
    except json.JSONDecodeError as err:
        raise PreflightError(f"{file}: not valid JSON ({err.msg} at line {err.lineno})") from None


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) not in (2, 3, 4):
        print("usage: python -m serving.speculative.preflight DRAFT TARGET [BLOCK_SIZE [BUDGET]]", file=sys.stderr)
        return 2
    try:
        draft, target = read_config(args[0]), read_config(args[1])
        numbers = [int(a) for a in args[2:]] + [None, None]
        check(draft, target, block_size=numbers[0], budget=numbers[1])
    except (PreflightError, ValueError) as err:
        print(f"preflight: {err}", file=sys.stderr)
        return 1
    print(f"preflight: ok ({args[0]} on {args[1]})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
