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
The LM head stays dense (it is the token embedding of tied models, and drafters read its rows)
and runs through oneDNN on the dense matrix, which still avoids MKL's small-M path.

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


def head(hidden: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """hidden [T, H] @ weight [V, H]^T -> [T, V], weight dense (the LM head). oneDNN's op has no
    backward: a draft trained through the target's head (serving/tools/train_draft.py) would
    learn nothing from it, so a hidden that carries gradients takes F.linear."""
    if packable(weight) and hidden.dtype == weight.dtype and not (hidden.requires_grad and torch.is_grad_enabled()):
        return torch.ops.mkldnn._linear_pointwise(hidden.contiguous(), weight, None, "none", [], "")
    return F.linear(hidden, weight)
