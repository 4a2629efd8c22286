"""Will this draft run on this target? Decided from the two config.json dicts alone.

Stdlib only, so it runs without torch or weights (`python -m serving.speculative.preflight
DRAFT_DIR TARGET_DIR`, locally or on a host over SSH). Every message names both sides.
The rules live in serving/contract/pairing.py, which ddops runs on the host's files before a
deploy; here they run at start-up before weights load, and the captured width is checked again
at the first forward (`check_captured`).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Mapping

from serving.contract import pairing
from serving.contract.pairing import derived_layer_ids, mask_token_id, target_layer_ids

from .base import PreflightError

__all__ = ["PreflightError", "check", "check_captured", "derived_layer_ids", "mask_token_id", "problems",
           "read_config", "target_layer_ids"]


def problems(draft: Mapping, target: Mapping, block_size: int | None = None, budget: int | None = None,
             fc_in: int | None = None) -> list[str]:
    """Every mismatch (the shared rules of serving/contract/pairing.py), one line each."""
    return [p.reason for p in pairing.problems(draft, target, block_size, budget, fc_in)]


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
