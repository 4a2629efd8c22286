"""DFlash 2's grouped dynamic causal convolution, run before attention and before the MLP in
every layer of a draft whose architecture has convs (serving/contract/drafts.py).

Layout as z-lab's `dflash` 0.1.0 saves it (GroupedDynamicCausalConv): per conv, `base_kernel`
[2, K, H] and `kernel_projection` Linear(H -> 2*K*G, no bias), G = H / conv_group_size groups
of conv_group_size channels. With h the normed input [.., L, H] along the block's rows and
d = kernel_projection(h) split into two dynamic kernels d0, d1 [.., L, K, G]:

    prepare: u[t] = sum_{o<K} (base_kernel[0][o] + d0[t, o, g(c)]) * h[t - o]     (h[<0] = 0)
    finish:  y[t] = sum_{o<K} (base_kernel[1][o] + d1[t, o, g(c)]) * a[t - o]

where a is the attention (or MLP) output of u. The kernel at row t comes from row t's own h,
and the output replaces its input; the residual add follows as in DFlash 1. Only block rows
pass through the convs: the context K/V (projected target features) do not.

Rows of several blocks may be packed along L (the batched drafter): `offsets` [L] gives each
row's index inside its own block, and a row never reads one of another block.
"""

from __future__ import annotations

import torch
from torch import nn


class GroupedDynamicCausalConv(nn.Module):
    def __init__(self, hidden: int, kernel: int, group_size: int):
        super().__init__()
        self.kernel, self.groups = kernel, hidden // group_size
        self.base_kernel = nn.Parameter(torch.empty(2, kernel, hidden))
        self.kernel_projection = nn.Linear(hidden, 2 * kernel * self.groups, bias=False)

    def prepare(self, h: torch.Tensor, offsets: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """h [.., L, H] -> (the first convolution of h [.., L, H], the second kernel [.., L, K, G])."""
        dynamic = self.kernel_projection(h).unflatten(-1, (2, self.kernel, self.groups))  # [.., L, 2, K, G]
        return convolve(h, dynamic[..., 0, :, :], self.base_kernel[0], offsets), dynamic[..., 1, :, :]

    def finish(self, a: torch.Tensor, dynamic: torch.Tensor, offsets: torch.Tensor | None) -> torch.Tensor:
        return convolve(a, dynamic, self.base_kernel[1], offsets)


def convolve(x: torch.Tensor, dynamic: torch.Tensor, base: torch.Tensor, offsets: torch.Tensor | None) -> torch.Tensor:
    """x [.., L, H], dynamic [.., L, K, G], base [K, H] -> [.., L, H]: causal along L, each of the
    G channel groups with its own per-row kernel on top of the per-channel base kernel."""
    kernel, groups = dynamic.shape[-2], dynamic.shape[-1]
    parts = x.unflatten(-1, (groups, -1))                       # [.., L, G, H/G]
    out = torch.zeros_like(parts)
    for o in range(kernel):
        shifted = parts if o == 0 else torch.cat([torch.zeros_like(parts[..., :o, :, :]), parts[..., :-o, :, :]], -3)
        if o and offsets is not None:                            # rows with fewer than o predecessors in their block
            shifted = shifted * (offsets >= o).to(x.dtype)[:, None, None]
        # base and dynamic terms added one after the other (the package's order, so fp32 sums agree)
        out = torch.addcmul(out + base[o].view(groups, -1).to(x.dtype) * shifted, dynamic[..., o, :, None], shifted)
    return out.flatten(-2)


def mixed_before(conv: GroupedDynamicCausalConv | None, h: torch.Tensor, offsets):
    """The layer's input to attention / MLP: h itself without convs, else prepare(h)."""
    return (h, None) if conv is None else conv.prepare(h, offsets)


def mixed_after(conv: GroupedDynamicCausalConv | None, a: torch.Tensor, dynamic, offsets) -> torch.Tensor:
    return a if conv is None else conv.finish(a, dynamic, offsets)


def identity_(conv: GroupedDynamicCausalConv) -> None:
    """Make the conv the identity (base kernel 1 at offset 0, the rest and the projection 0):
    a DFlash 2 draft with identity convs and a zero selector proposes what its DFlash 1 weights do."""
    with torch.no_grad():
        conv.base_kernel.zero_()
        conv.base_kernel[:, 0] = 1.0
        conv.kernel_projection.weight.zero_()
