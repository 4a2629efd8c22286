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
rows), and a packed copy of it runs the head's product (`pack_matrices`): oneDNN on the dense
[V, H] matrix took 8.3 ms at 8 rows against 4.6 ms packed (SmolLM2's [49152, 576], one core),
which made the dense head a fifth of a batched decode step. The copy costs V x H more bytes,
as in vLLM's CPU backend, which packs the vocabulary embedding's matrix for the head and keeps
the dense one for lookups (`dispatch_cpu_unquantized_gemm(layer, remove_weight=False)` in
vllm/model_executor/layers/vocab_parallel_embedding.py, vLLM 0.32);
serving.contract.runtime.head_copies is the rule ddops' fit counts it by.

Row i of a product does not depend on the other rows (checked for M = 1..33), so a sequence's
logits are the same alone and in a batch, and a product of fewer rows may run padded with zero
rows. On some CPUs that pays: on a 2-core AMD EPYC (AVX-512, no AMX) oneDNN's 1- and 2-row
kernels stream the weights slower than its 4-row one, and SmolLM2's whole forward took 44.7 ms
at 1 row against 39.5 ms with every product padded to 4 rows (medians of 8 interleaved runs,
one core; 57.7 ms at 2 rows). Which CPU this is, nothing in its flags says, so `small_rows`
measures it once at load: a pass over the model's packed products (each weight streamed from
memory once, as in a decode step; at most 256 MB of them) at 1 row and at 4 rows.

bf16 weights, where serving/kernels/linear_bf16.c built and probed, are packed into that kernel's
blocked layout instead of oneDNN's (`pack_matrices`): it read SmolLM2's layers 1.5x as fast as
oneDNN's bf16 product at one row and 1.3x at eight (its docstring has the figures). Its rows do
not depend on each other either, and its results are fp32, unrounded.
"""

from __future__ import annotations

import math
import time

import torch
import torch.nn.functional as F
from torch import nn

from serving.kernels import linear_bf16
from serving.models.rope import apply_rope

PACK_ROWS = 8   # the row count oneDNN tunes the blocked layout for (any M runs); decode batches
PAD_ROWS = 4    # the row count a product of fewer rows may be padded to (small_rows decides)


def packable(weight: torch.Tensor) -> bool:
    """oneDNN runs this weight packed: a matrix on CPU in a torch built with oneDNN, in fp32, or in
    bf16 where oneDNN runs bf16 on this CPU (serving.contract.runtime.PACKED_ON_CPU)."""
    if not (weight.device.type == "cpu" and weight.dim() == 2 and torch.backends.mkldnn.is_available()
            and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")):
        return False
    return weight.dtype == torch.float32 or (weight.dtype == torch.bfloat16
                                             and torch.ops.mkldnn._is_mkldnn_bf16_supported())


def product(rows: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None, min_rows: int = 1,
            n: int | None = None) -> torch.Tensor:
    """rows [M, K] @ a packed [N, K] weight (`pack_matrices`; n = N, which a blocked bf16 weight
    does not keep) -> [M, N] in rows' dtype; fewer than `min_rows` rows run padded with zero rows
    (row i of the product does not depend on the others) and the padding is dropped. Rows of
    another dtype than a oneDNN weight's (fp32 activations against bf16 weights:
    serving.contract.runtime.compute_dtype) are rounded to it for the product, and the result,
    summed in fp32 and rounded to the weight's dtype by oneDNN, comes back in theirs."""
    if linear_bf16.is_blocked(packed):                  # pads inside the kernel
        return linear_bf16.product(rows, packed, n, bias, min_rows)
    m, x = rows.shape[0], rows if rows.dtype == packed.dtype else rows.to(packed.dtype)
    if m < min_rows:
        x = torch.cat([x, x.new_zeros(min_rows - m, x.shape[1])])
    # oneDNN: its packed layout, or a dense [N, K] matrix (a head without a copy)
    out = torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")
    out = out if m >= min_rows else out[:m]
    return out if out.dtype == rows.dtype else out.to(rows.dtype)


class Linear(nn.Linear):
    """nn.Linear whose weight `pack` may reorder, once, into oneDNN's layout."""

    packed = False
    min_rows = 1    # fewer rows run padded to this many (small_rows)

    def take(self, packed: torch.Tensor | None) -> None:
        """Run on `packed`, this weight packed (pack_matrices), in place of the dense weight;
        None: stay dense."""
        if packed is not None and not self.packed:
            self.weight = nn.Parameter(packed, requires_grad=False)
            self.packed = True

    def fused(self, x: torch.Tensor, norm: nn.Module | None = None, swiglu: bool = False,
              residual: torch.Tensor | None = None, rope: tuple | None = None) -> torch.Tensor:
        """residual + this product of norm(x), or of silu(gate) * up where x is [T, 2K] gate then
        up (`norm`: an RMSNorm, its `weight` and `eps`), its first `heads` heads of D rotated
        after (rope = (cos, sin [T, D], heads)); each part optional. A blocked bf16 weight runs it
        in one kernel call on fp32 rows (linear_bf16.product); any other weight, as the operations
        one by one."""
        if self.packed and linear_bf16.is_blocked(self.weight) and x.dtype == torch.float32 and x.dim() == 2:
            return linear_bf16.product(x, self.weight, self.out_features, self.bias, self.min_rows,
                                       norm=None if norm is None else (norm.weight, norm.eps), swiglu=swiglu,
                                       residual=residual, rope=rope)
        if norm is not None:
            x = norm(x)
        if swiglu:
            gate, up = x.chunk(2, dim=-1)
            x = F.silu(gate) * up
        out = self(x)
        out = out if residual is None else residual + out
        if rope is not None:
            cos, sin, heads = rope
            T, D = out.shape[0], cos.shape[-1]
            out[:, :heads * D] = apply_rope(out[:, :heads * D].view(T, heads, D), cos, sin).view(T, heads * D)
        return out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.packed:
            return product(x, self.weight, self.bias, self.min_rows if x.dim() == 2 else 1, self.out_features)
        if x.dtype != self.weight.dtype:        # bf16 weights where oneDNN does not run bf16
            return F.linear(x.to(self.weight.dtype), self.weight, self.bias).to(x.dtype)
        return F.linear(x, self.weight, self.bias)


def pack_matrices(weights: list[torch.Tensor]) -> list[torch.Tensor | None]:
    """Each weight [N, K] packed for `product`, in order: bf16 ones where linear_bf16 runs into its
    blocked layout, side by side in one arena on huge pages (linear_bf16.arena) in the order
    given (a model gives the order its forward reads them, so a step streams one run of memory);
    others into oneDNN's layout where oneDNN runs them (`packable`); None where neither does."""
    shapes = [linear_bf16.blocked_shape(*w.shape) if _blocked(w) else None for w in weights]
    store = linear_bf16.arena(sum(math.prod(s) for s in shapes if s is not None))
    packed, at = [], 0
    for weight, shape in zip(weights, shapes):
        if shape is None:
            packed.append(torch.ops.mkldnn._reorder_linear_weight(weight.detach(), PACK_ROWS)
                          if packable(weight) else None)
            continue
        size = math.prod(shape)
        packed.append(linear_bf16.pack(weight, store[at:at + size].view(shape)))
        at += size
    return packed


def _blocked(weight: torch.Tensor) -> bool:
    """linear_bf16 runs this weight: a bf16 matrix on a CPU where the kernel built and probed."""
    return weight.dtype == torch.bfloat16 and weight.dim() == 2 and linear_bf16.available(weight.device)[0]


def small_rows(products: list[tuple[torch.Tensor, torch.Tensor | None, int, int]], dtype: torch.dtype,
               repeats: int = 5, stream_bytes: int = 256 << 20) -> tuple[int, dict]:
    """PAD_ROWS where a pass over a model's packed products (packed weight, bias, N, K) with rows
    of `dtype` (what the model computes in) takes less time at PAD_ROWS rows than at 1, by 3 % or
    more (noise), else 1; and the two passes' median milliseconds. The pass takes products in
    order up to `stream_bytes` of weights, more than any CPU cache holds, so each weight is read
    from memory as a decode step reads it, and a large model's load pays no more than a small
    one's (~12 passes of 256 MB)."""
    chosen, total = [], 0
    for p in products:
        if total >= stream_bytes:
            break
        chosen.append(p)
        total += p[0].numel() * p[0].element_size()
    if not chosen:
        return 1, {}
    inputs = {m: [torch.zeros(m, k, dtype=dtype) for _, _, _, k in chosen] for m in (1, PAD_ROWS)}
    seconds: dict[int, list[float]] = {1: [], PAD_ROWS: []}
    for _ in range(repeats + 1):              # interleaved; the first of each primes oneDNN's kernels
        for m in (1, PAD_ROWS):
            began = time.perf_counter()
            for (w, b, n, _), x in zip(chosen, inputs[m]):
                product(x, w, b, 1, n)
            seconds[m].append(time.perf_counter() - began)
    ms = {m: round(sorted(t[1:])[repeats // 2] * 1000, 2) for m, t in seconds.items()}
    return (PAD_ROWS if ms[PAD_ROWS] < 0.97 * ms[1] else 1), ms


def head(hidden: torch.Tensor, weight: torch.Tensor, packed: torch.Tensor | None = None,
         min_rows: int = 1) -> torch.Tensor:
    """hidden [..., H] @ weight [V, H]^T -> [..., V] in hidden's dtype, weight dense (the LM head),
    `packed` its packed copy (pack_matrices) if the model keeps one. oneDNN's op has no backward: a draft
    trained through the target's head (serving/tools/train_draft.py) would learn nothing from
    it, so a hidden that carries gradients takes F.linear."""
    if hidden.requires_grad and torch.is_grad_enabled():
        return F.linear(hidden, weight)
    if packed is None and not packable(weight):
        return F.linear(hidden.to(weight.dtype), weight).to(hidden.dtype)
    rows = hidden.reshape(-1, hidden.shape[-1])           # the products take [T, H]: [..., H] as rows
    out = product(rows.contiguous(), weight if packed is None else packed, None,
                  min_rows if packed is not None else 1, weight.shape[0])
    return out.view(*hidden.shape[:-1], out.shape[-1])
