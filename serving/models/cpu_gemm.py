"""The dense models' matrix products on CPU: oneDNN with weights repacked once at load.

`F.linear` on CPU calls MKL's sgemm, which repacks the weight on every call; for the row counts
of batched decoding (M = 2..32 rows against [N, K] weights) that repacking and its small-M
blocking cost more than the product. oneDNN with the weight reordered once into its blocked
layout (`torch.ops.mkldnn._reorder_linear_weight`, the kernel torch's inductor uses on CPU) does
not; vLLM's CPU backend does the same for its linear layers (`dispatch_cpu_unquantized_gemm` in
vllm/model_executor/layers/utils.py: oneDNN `create_onednn_mm` with the weight prepacked, the
dense copy dropped).

The packed weight replaces the dense one (no copy: the same bytes, in an opaque layout), so a
packed `Linear` can no longer be loaded into or read as a matrix; packing comes after loading.
The LM head stays dense too (it is the token embedding of tied models, and drafters read its
rows), and a packed copy of it runs the head's product (`pack_head`): oneDNN on the dense
[V, H] matrix took 8.3 ms at 8 rows against 4.6 ms packed (SmolLM2's [49152, 576], one core),
which made the dense head a fifth of a batched decode step. The copy costs V x H more bytes,
as in vLLM's CPU backend, which packs the vocabulary embedding's matrix for the head and keeps
the dense one for lookups (`dispatch_cpu_unquantized_gemm(layer, remove_weight=False)` in
vllm/model_executor/layers/vocab_parallel_embedding.py, vLLM 0.32);
serving.contract.runtime.head_copies is the rule ddops' fit counts it by.

Row i of a product does not depend on the other rows (checked for M = 1..33), so a sequence's
logits are the same alone and in a batch.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

PACK_ROWS = 8   # the row count oneDNN tunes the blocked layout for (any M runs); decode batches


def packable(weight: torch.Tensor) -> bool:
    """oneDNN runs this weight: an fp32 matrix on CPU in a torch built with oneDNN."""
    return (weight.device.type == "cpu" and weight.dtype == torch.float32 and weight.dim() == 2
            and torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_reorder_linear_weight"))


class Linear(nn.Linear):
    """nn.Linear whose weight `pack` may reorder, once, into oneDNN's layout."""

    packed = False

    def pack(self) -> None:
        if self.packed or not packable(self.weight):
            return
        blocked = torch.ops.mkldnn._reorder_linear_weight(self.weight.detach(), PACK_ROWS)
        self.weight = nn.Parameter(blocked, requires_grad=False)
        self.packed = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.packed:
            return torch.ops.mkldnn._linear_pointwise(x, self.weight, self.bias, "none", [], "")
        return F.linear(x, self.weight, self.bias)


def pack_linears(module: nn.Module) -> int:
    """Pack every `Linear` under `module` (a loaded model); returns how many were packed."""
    linears = [m for m in module.modules() if isinstance(m, Linear)]
    for linear in linears:
        linear.pack()
    return sum(linear.packed for linear in linears)


def pack_head(weight: torch.Tensor) -> torch.Tensor | None:
    """A oneDNN-packed copy of the dense head [V, H] for `head`, or None where oneDNN does not run it."""
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach(), PACK_ROWS) if packable(weight) else None


def head(hidden: torch.Tensor, weight: torch.Tensor, packed: torch.Tensor | None = None) -> torch.Tensor:
    """hidden [..., H] @ weight [V, H]^T -> [..., V], weight dense (the LM head), `packed` its
    `pack_head` copy if the model keeps one. oneDNN's op has no backward: a draft trained
    through the target's head (serving/tools/train_draft.py) would learn nothing from it, so a
    hidden that carries gradients takes F.linear."""
    if not packable(weight) or hidden.dtype != weight.dtype or (hidden.requires_grad and torch.is_grad_enabled()):
        return F.linear(hidden, weight)
    rows = hidden.reshape(-1, hidden.shape[-1])           # oneDNN's op takes [T, H]: [..., H] as rows
    out = torch.ops.mkldnn._linear_pointwise(rows.contiguous(), weight if packed is None else packed,
                                             None, "none", [], "")
    return out.view(*hidden.shape[:-1], out.shape[-1])
