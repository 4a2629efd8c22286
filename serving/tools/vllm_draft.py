"""vLLM's spelling of a draft's reduced vocabulary, written beside the bundled runtime's.

    python -m serving.tools.vllm_draft --draft DIR [--target DIR]

The bundled runtime reads `draft_vocab.json` and takes those rows of the target's LM head.
vLLM 0.32 ignores that file and proposes over the full vocabulary unless the draft folder says,
in its own terms (vllm/model_executor/models/qwen3_dflash.py, `DFlashQwen3ForCausalLM`):

- config.json `draft_vocab_size` = V': the draft's LM head has V' rows (`vocab_size` stays the
  target's: vLLM scatters the V' logits into a full-vocabulary row, the rest -inf);
- tensor `d2t`, int64 [V']: draft row i proposes target id i + d2t[i] (`compute_logits`;
  `load_weights` renames it to `draft_id_to_target_id`; `t2d` is skipped, so none is written);
- tensor `lm_head.weight` [V', H]: without one vLLM shares the target's full head
  (vllm/v1/spec_decode/llm_base_proposer.py, `_maybe_share_lm_head`), whose V logits do not fit
  the V' targets. Here: the target's head rows at the draft_vocab.json ids, in that order, so
  row i of both runtimes' heads is the same token.

These two tensors go in their own file, VLLM_FILE. vLLM loads every `*.safetensors` of a
folder without an index (vllm/model_executor/model_loader/default_loader.py,
`DefaultModelLoader._prepare_weights`); the bundled runtime and ddops read `model.safetensors`
alone (serving.models.loader.tensor_files, ddops/checkpoint.py), so they never see it and
load the folder as before. A draft whose vocabulary is the whole target vocabulary gets
neither: vLLM then shares the target's head, which proposes what the bundled runtime does.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

from serving.speculative.dflash import DRAFT_VOCAB, load_vocab

VLLM_FILE = "vllm_vocab.safetensors"
VLLM_KEY = "draft_vocab_size"


def d2t(ids: list[int]) -> torch.Tensor:
    """int64 [V']: the offset from draft row i to its target id, ids[i] - i."""
    return torch.tensor(ids, dtype=torch.int64) - torch.arange(len(ids), dtype=torch.int64)


def vllm_tensors(ids: list[int], head: torch.Tensor) -> dict[str, torch.Tensor]:
    """lm_head.weight [V', H] (rows of the target's head `head` [V, H] at `ids`) and d2t [V']."""
    rows = head.detach()[torch.tensor(ids, dtype=torch.long)].to(torch.float32).contiguous()
    return {"lm_head.weight": rows, "d2t": d2t(ids)}


def reduced(ids: list[int] | None, vocab_size: int) -> bool:
    """Whether vLLM needs the reduced form: a vocabulary smaller than the target's."""
    return ids is not None and len(ids) < vocab_size


def vllm_config(config: dict, ids: list[int] | None) -> dict:
    """config.json with `draft_vocab_size` for a reduced vocabulary, without it otherwise."""
    out = {k: v for k, v in config.items() if k != VLLM_KEY}
    if reduced(ids, int(config["vocab_size"])):
        out[VLLM_KEY] = len(ids)
    return out


def write_tensors(draft: Path, ids: list[int] | None, head: torch.Tensor) -> None:
    """DRAFT/VLLM_FILE for a reduced vocabulary; a stale one removed otherwise."""
    file = Path(draft) / VLLM_FILE
    if not reduced(ids, head.shape[0]):
        file.unlink(missing_ok=True)
        return
    save_file(vllm_tensors(ids, head), str(file))
    file.chmod(0o644)  # save_file writes 0600; services may run as another user


def export(draft: Path, ids: list[int] | None, head: torch.Tensor) -> None:
    """Rewrite a finished draft folder's vLLM form for `ids`: tensors first, config.json last."""
    file = Path(draft) / "config.json"
    if not file.is_file():
        raise FileNotFoundError(f"{file}: no draft config (write the draft before its vLLM form)")
    write_tensors(draft, ids, head)
    file.write_text(json.dumps(vllm_config(json.loads(file.read_text()), ids), indent=2))


def main(argv=None) -> int:
    from serving.tools.train_draft import CACHE, load_target

    ap = argparse.ArgumentParser(prog="python -m serving.tools.vllm_draft", description=__doc__.splitlines()[0])
    ap.add_argument("--draft", type=Path, required=True, help=f"draft folder holding {DRAFT_VOCAB}")
    ap.add_argument("--target", type=Path, default=CACHE / "models/smollm2-135m-instruct")
    args = ap.parse_args(argv)
    target = load_target(args.target, positions=16)
    ids = load_vocab(args.draft, target.config.vocab_size)
    export(args.draft, ids, target.lm_head_weight)
    told = f"{len(ids)} draft rows in {args.draft / VLLM_FILE}" if reduced(ids, target.config.vocab_size) \
        else "no reduced vocabulary: vLLM shares the target's head"
    print(f"vLLM form of {args.draft}: {told}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
