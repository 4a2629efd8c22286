"""The bf16 products (serving.kernels.linear_bf16) against F.linear, and where a bf16 model runs them."""

import pytest
import torch
import torch.nn.functional as F

from serving.kernels import linear_bf16
from serving.kernel_report import target_kernels
from serving.models.config import RopeConfig
from serving.models.cpu_gemm import Linear, head
from serving.models.rope import apply_rope, rope_tables
from serving.tools.tiny import write_tiny
from tests.serving.conftest import load


def test_the_kernel_builds_and_passes_its_probe_on_this_host():
    ok, why = linear_bf16.available("cpu")       # make setup installs gcc; a wrong kernel fails its probe
    assert ok, why
    ok, why = linear_bf16.available("meta")
    assert not ok and "CPU" in why


@pytest.mark.parametrize("n, k, bias", [(576, 576, False), (1536, 576, False), (576, 1536, True),
                                        (70, 33, True), (1, 1, False), (200, 7, False)])
def test_products_are_f_linear_of_the_bf16_rounded_rows(n, k, bias):
    """The same products as a bf16 matmul (inputs rounded to nearest even, exact products), summed
    in fp32; partial column blocks and odd K are padded with zeros that add nothing."""
    gen = torch.Generator().manual_seed(n * k)
    w, x = torch.randn(n, k, generator=gen).bfloat16(), torch.randn(9, k, generator=gen)
    b = torch.randn(n, generator=gen) if bias else None
    got = linear_bf16.product(x, linear_bf16.pack(w), n, b)
    want = F.linear(x.bfloat16().float(), w.float(), b)
    assert got.shape == (9, n) and got.dtype == torch.float32
    torch.testing.assert_close(got, want, atol=2e-5 * want.abs().max().item(), rtol=0)
    as_bf16 = linear_bf16.product(x.bfloat16(), linear_bf16.pack(w), n, b)      # bf16 rows come back bf16
    assert as_bf16.dtype == torch.bfloat16 and torch.equal(as_bf16, got.bfloat16())
    batched = linear_bf16.product(x.view(3, 3, k), linear_bf16.pack(w), n, b)     # [..., K] rows
    assert batched.shape == (3, 3, n) and torch.equal(batched.view(9, n), got)


def test_a_row_is_the_same_alone_and_in_any_batch():
    """Row i's result does not depend on the rows beside it (bit for bit, 1 to 33 rows), which is
    what keeps a sequence's logits the same alone, batched and in a verify tree."""
    w = torch.randn(960, 576).bfloat16()
    blocked, x = linear_bf16.pack(w), torch.randn(33, 576)
    alone = torch.cat([linear_bf16.product(x[i:i + 1], blocked, 960) for i in range(33)])
    for m in range(1, 34):
        assert torch.equal(linear_bf16.product(x[:m], blocked, 960), alone[:m]), m


def test_a_bf16_model_packs_its_products_and_head_blocked_and_says_so(tmp_path):
    """A bf16 model on CPU: every Linear and the head's copy blocked for the kernel, the dense
    table kept for lookups, activations in fp32 and K/V rows in bf16, which the native decode
    attention reads; /server_info's kernels name them."""
    model = load(write_tiny(tmp_path / "m", arch="llama", dtype="bfloat16"), torch.bfloat16)
    linears = [m for m in model.modules() if isinstance(m, Linear)]
    assert linears and all(m.packed and linear_bf16.is_blocked(m.weight) for m in linears)
    assert linear_bf16.is_blocked(model.lm_head_packed) and model.lm_head_weight.dim() == 2
    assert model.dtype == torch.float32 and model.new_cache(4).k.dtype == torch.bfloat16
    kernels = target_kernels(model)
    assert kernels["products"].startswith("bf16 blocked") and kernels["compute_dtype"] == "float32"
    assert kernels["kv_dtype"] == "bfloat16" and kernels["decode_attention"] == "native"
    hidden = torch.randn(3, model.config.hidden_size)
    with torch.inference_mode():
        logits = head(hidden, model.lm_head_weight, model.lm_head_packed)
    dense = F.linear(hidden.bfloat16().float(), model.lm_head_weight.float())
    torch.testing.assert_close(logits, dense, atol=2e-5 * dense.abs().max().item(), rtol=0)


def test_the_fused_norm_swiglu_and_residual_are_the_operations_one_by_one():
    """`product`'s norm, swiglu, residual and rope against the same operations in PyTorch around
    the product: equal but for a last-bit difference that a bf16 rounding may turn into one step."""
    gen = torch.Generator().manual_seed(3)
    n, k = 200, 96
    w, bias = torch.randn(n, k, generator=gen).bfloat16(), torch.randn(n, generator=gen)
    blocked, x, residual = linear_bf16.pack(w), torch.randn(5, k, generator=gen), torch.randn(5, n, generator=gen)
    weight, gate_up = torch.randn(k, generator=gen), torch.randn(5, 2 * k, generator=gen)
    cases = [(linear_bf16.product(x, blocked, n, bias, norm=(weight, 1e-6)), F.rms_norm(x, (k,), weight, 1e-6), 0),
             (linear_bf16.product(gate_up, blocked, n, bias, swiglu=True), F.silu(gate_up[:, :k]) * gate_up[:, k:], 0),
             (linear_bf16.product(x, blocked, n, bias, residual=residual), x, residual)]
    for got, rows, add in cases:
        want = add + F.linear(rows.bfloat16().float(), w.float(), bias)
        scale = want.abs().max().item()
        assert (got - want).abs().max() < 2e-2 * scale and (got - want).abs().mean() < 1e-3 * scale
    cos, sin = rope_tables(RopeConfig(theta=10000.0), 40, 64)   # 3 heads of 40 of the 200 columns rotate
    cos, sin = cos[[3, 9, 17, 30, 63]], sin[[3, 9, 17, 30, 63]]
    got = linear_bf16.product(x, blocked, n, bias, rope=(cos, sin, 3))
    plain = F.linear(x.bfloat16().float(), w.float(), bias)
    want = torch.cat([apply_rope(plain[:, :120].view(5, 3, 40), cos, sin).view(5, 120), plain[:, 120:]], dim=1)
    torch.testing.assert_close(got, want, atol=1e-5 * want.abs().max().item(), rtol=0)


def test_a_models_packed_weights_lie_in_one_arena_in_the_order_a_forward_reads_them(tmp_path):
    """Layer by layer, q/k/v, o, gate/up, down, then the head's copy, each right after the last:
    a decode step streams one run of memory."""
    model = load(write_tiny(tmp_path / "m", arch="llama", dtype="bfloat16"), torch.bfloat16)
    weights = [m.weight for m in model.modules() if isinstance(m, Linear)] + [model.lm_head_packed]
    for before, after in zip(weights, weights[1:]):
        assert after.data_ptr() == before.data_ptr() + before.numel() * before.element_size()


def test_the_arena_is_on_huge_pages_where_the_os_gives_them():
    """madvise(MADV_HUGEPAGE) before the first touch: with transparent huge pages not [never],
    the arena's mapping holds huge pages (a stream reads 1.5x as fast here); the arena starts on
    a 2 MiB boundary."""
    store = linear_bf16.arena(24 << 20)                 # 48 MiB
    assert store.data_ptr() % linear_bf16.HUGE_PAGE == 0 and store.numel() == 24 << 20
    store.fill_(1)
    thp = open("/sys/kernel/mm/transparent_hugepage/enabled").read()
    if "[never]" in thp:
        pytest.skip(f"this host's transparent huge pages are off: {thp.strip()}")
    assert _huge_kb(store.data_ptr()) >= 40 << 10, thp


def _huge_kb(address: int) -> int:
    """AnonHugePages (kB) of this process's mapping that holds `address` (/proc/self/smaps)."""
    inside = False
    for line in open("/proc/self/smaps"):
        head = line.split()[0]
        if "-" in head and not head.endswith(":"):
            start, end = (int(a, 16) for a in head.split("-"))
            inside = start <= address < end
        elif inside and head == "AnonHugePages:":
            return int(line.split()[1])
    return 0
