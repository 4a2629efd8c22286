"""The peer: z-lab's `dflash` package's own generation loop on the same target and draft.

Its target is transformers' model of the same checkpoint (fp32, eager CPU), its draft its own
DFlashDraftModel loaded from the same directory; greedy, the draft's block size, the same
prompts and stop ids. The package is a dev dependency (`make venv` installs it), imported
only here.
"""

from __future__ import annotations

import time
from pathlib import Path

from serving.bench.spec import MethodResult


def run_peer(model_dir: Path, draft_dir: Path, prompts: list[list[int]], max_tokens: int,
             stop_ids: frozenset) -> MethodResult:
    import torch
    import transformers

    try:
        from dflash.model import DFlashDraftModel, dflash_generate
    except ImportError as err:
        raise ValueError(f"--peer needs z-lab's dflash package (pip install --no-deps dflash): {err}") from None
    target = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    draft = DFlashDraftModel.from_pretrained(draft_dir, dtype=torch.float32).eval()
    result = MethodResult("dflash package", speculative=True)

    def generate(prompt: list[int], n: int) -> list[int]:
        ids = torch.tensor([prompt])
        out = dflash_generate(draft, target, ids, max_new_tokens=n, stop_token_ids=sorted(stop_ids))
        return out[0, len(prompt):].tolist()

    generate(prompts[0][:16], 8)  # warm-up, as bench.spec.prepare does
    for prompt in prompts:
        began = time.perf_counter()
        out = generate(prompt, max_tokens)
        result.seconds += time.perf_counter() - began
        result.tokens += len(out)
        result.outputs.append(out)
    return result
