"""The native decode attention (serving/kernels) against the PyTorch form it replaces, and the
fallback when it cannot be built."""

import subprocess
import sys

import pytest
import torch

from serving.engine.kv_pool import KVPool
from serving.kernels import build
from serving.kernels import decode_attention as native
from serving.models.decode_attention import DecodeRows


class Dims:
    def __init__(self, layers, kv_heads, head_dim):
        self.full_attention_layers, self.num_key_value_heads, self.head_dim = list(range(layers)), kv_heads, head_dim


def pool_with(kv_heads, head_dim, lengths, seed=0):
    """A filled pool with one cache per length (committed rows), reserved with a gap between."""
    torch.manual_seed(seed)
    pool = KVPool(Dims(2, kv_heads, head_dim), 64 * len(lengths) + 64, torch.float32, "cpu")
    pool.k.normal_(), pool.v.normal_()
    caches = []
    for n in lengths:
        pool.reserve(3)                       # ranges that do not start at 0 or touch each other
        caches.append(pool.reserve(n + 8))
        caches[-1].length = n
    return pool, caches


def projection(B, heads, kv_heads, D):
    """q, k, v laid out as Attention.project leaves them: views into one [B, (H + 2 KV) * D] output."""
    qkv = torch.randn(B, (heads + 2 * kv_heads) * D)
    qk = qkv[:, :(heads + kv_heads) * D].view(B, heads + kv_heads, D)
    return qk[:, :heads], qk[:, heads:], qkv[:, (heads + kv_heads) * D:].view(B, kv_heads, D)


def torch_form(caches, layer, q, k, v):
    plan = DecodeRows.plan(caches, "cpu")
    gather = DecodeRows(plan.pool, plan.starts, plan.lengths, False, plan.starts + plan.lengths - 1,
                        *_padded(plan.starts, plan.lengths))
    return gather.attend(layer, q, k, v)


def _padded(starts, lengths):
    width = int(lengths.max())
    offsets = torch.arange(width)
    visible = offsets[None, :] < lengths[:, None]
    return (starts[:, None] + torch.where(visible, offsets[None, :], 0)).reshape(-1), visible[:, None, None, :], width


def test_the_kernel_builds_and_passes_its_probe_on_this_host():
    """make setup installs gcc, so the native path is the one served here; a kernel that builds
    but disagrees with SDPA fails its probe and this."""
    ok, why = native.available(torch.float32, "cpu")
    assert ok, why


@pytest.mark.parametrize("heads,kv_heads,D", [(9, 3, 64), (8, 8, 128), (4, 2, 256), (4, 2, 24), (6, 1, 16), (2, 1, 288)])
def test_the_kernel_agrees_with_the_gather_and_sdpa_and_writes_the_new_rows(heads, kv_heads, D):
    lengths = [1, 7, 40, 19]
    pool, caches = pool_with(kv_heads, D, lengths)
    reference, _ = pool_with(kv_heads, D, lengths)
    q, k, v = projection(len(lengths), heads, kv_heads, D)
    plan = DecodeRows.plan(caches, "cpu")
    assert plan.in_place
    got = plan.attend(1, q, k, v)
    want = torch_form([reference_view(reference, c) for c in caches], 1, q, k, v)
    assert got.shape == (len(lengths), heads * D)
    assert torch.allclose(got, want, atol=2e-6, rtol=1e-5)
    assert torch.equal(pool.k, reference.k) and torch.equal(pool.v, reference.v)   # new rows written, no other


def reference_view(reference, cache):
    view = reference.rows(cache.pool_start, cache.capacity)
    view.length = cache.length
    return view


def test_a_sequences_attention_is_the_same_alone_and_in_any_batch():
    pool, caches = pool_with(3, 64, [30, 5, 61, 12])
    q, k, v = projection(4, 9, 3, 64)
    crowd = DecodeRows.plan(caches, "cpu").attend(0, q, k, v)
    for b in range(4):
        alone = DecodeRows.plan([caches[b]], "cpu").attend(0, q[b:b + 1], k[b:b + 1], v[b:b + 1])
        assert torch.equal(alone[0], crowd[b])


def test_threads_split_the_work_without_changing_a_bit():
    pool, caches = pool_with(3, 64, [50, 9, 33, 70, 2, 18])
    q, k, v = projection(6, 9, 3, 64)
    plan = DecodeRows.plan(caches, "cpu")
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = plan.attend(0, q, k, v)
        torch.set_num_threads(4)
        four = plan.attend(0, q, k, v)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(one, four)


def test_the_kernel_declines_other_dtypes_and_devices_with_a_reason():
    ok, why = native.available(torch.bfloat16, "cpu")
    assert not ok and "bfloat16" in why
    ok, why = native.available(torch.float32, "meta")
    assert not ok and "meta" in why


def test_without_a_compiler_the_pytorch_form_runs_and_says_why(tmp_path):
    """A fresh interpreter whose CC does not exist: no kernel, the reason, and a model's decode
    step still runs (on the gather and SDPA)."""
    script = (
        "import torch\n"
        "from serving.kernels import decode_attention as native\n"
        "from serving.models.decode_attention import DecodeRows\n"
        "from tests.serving.test_decode_attention import pool_with, projection\n"
        "ok, why = native.available(torch.float32, 'cpu')\n"
        "pool, caches = pool_with(3, 64, [4, 9])\n"
        "q, k, v = projection(2, 9, 3, 64)\n"
        "plan = DecodeRows.plan(caches, 'cpu')\n"
        "print(ok, plan.in_place, tuple(plan.attend(0, q, k, v).shape), why)\n")
    env = {"PATH": "/usr/bin:/bin", "CC": str(tmp_path / "no-such-cc"), build.CACHE_ENV: str(tmp_path / "cache")}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120,
                          cwd=str(__import__("pathlib").Path(__file__).parents[2]))
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("False False (2, 576) decode_attention.c did not build or load")
    assert not list((tmp_path / "cache").glob("*.so"))


def test_a_build_lands_whole_in_its_cache_and_is_reused(tmp_path, monkeypatch):
    monkeypatch.setenv(build.CACHE_ENV, str(tmp_path))
    lib, why = build.load.__wrapped__("decode_attention")
    assert lib is not None, why
    built = list(tmp_path.glob("decode_attention-*.so"))
    assert len(built) == 1 and not [p for p in tmp_path.iterdir() if p.is_dir()]   # no work directory left
    stamp = built[0].stat().st_mtime_ns
    assert build.load.__wrapped__("decode_attention")[0] is not None
    assert built[0].stat().st_mtime_ns == stamp
