"""The native attention of decode and verify rows (serving/kernels) against the PyTorch form it
replaces, its bit-for-bit sameness between a decode row and a verify row over the same keys, and
the fallback when it cannot be built."""

import subprocess
import sys

import pytest
import torch

from serving.engine.kv_pool import KVPool
from serving.kernels import build
from serving.kernels import decode_attention as native
from serving.models.decode_attention import DecodeRows, NativeRows


class Dims:
    def __init__(self, layers, kv_heads, head_dim):
        self.full_attention_layers, self.num_key_value_heads, self.head_dim = list(range(layers)), kv_heads, head_dim


def pool_with(kv_heads, head_dim, lengths, seed=0, dtype=torch.float32):
    """A filled pool with one cache per length (committed rows), reserved with a gap between."""
    torch.manual_seed(seed)
    pool = KVPool(Dims(2, kv_heads, head_dim), 64 * len(lengths) + 64, dtype, "cpu")
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
    """The gather and SDPA form (DecodeRows), built whether or not the kernel serves the pool."""
    starts = torch.tensor([c.pool_start for c in caches])
    lengths = torch.tensor([c.length + 1 for c in caches])
    return DecodeRows(caches[0].pool, starts + lengths - 1, *_padded(starts, lengths)).attend(layer, q, k, v)


def decode_plan(caches):
    return NativeRows.plan(caches, [1] * len(caches), [None] * len(caches), torch.float32, "cpu")


def _padded(starts, lengths):
    width = int(lengths.max())
    offsets = torch.arange(width)
    visible = offsets[None, :] < lengths[:, None]
    return (starts[:, None] + torch.where(visible, offsets[None, :], 0)).reshape(-1), visible[:, None, None, :], width


def test_the_kernel_builds_and_passes_its_probe_on_this_host():
    """make setup installs gcc, so the native path is the one served here, over fp32 and bf16
    pools; a kernel that builds but disagrees with SDPA fails its probe and this."""
    for dtype in (torch.float32, torch.bfloat16):
        ok, why = native.available(dtype, "cpu")
        assert ok, why


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("heads,kv_heads,D", [(9, 3, 64), (8, 8, 128), (4, 2, 256), (4, 2, 24), (6, 1, 16), (2, 1, 288)])
def test_the_kernel_agrees_with_the_gather_and_sdpa_and_writes_the_new_rows(heads, kv_heads, D, dtype):
    """Over a bf16 pool the new rows are rounded as torch rounds them (the pools equal to the
    bit) and the rows read widen to fp32, so the kernel matches SDPA over the same stored rows."""
    lengths = [1, 7, 40, 19]
    pool, caches = pool_with(kv_heads, D, lengths, dtype=dtype)
    reference, _ = pool_with(kv_heads, D, lengths, dtype=dtype)
    q, k, v = projection(len(lengths), heads, kv_heads, D)
    plan = decode_plan(caches)
    assert plan.rows is None and DecodeRows.plan(caches, torch.float32, "cpu") is None      # the kernel takes every row
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
    crowd = decode_plan(caches).attend(0, q, k, v)
    for b in range(4):
        alone = decode_plan([caches[b]]).attend(0, q[b:b + 1], k[b:b + 1], v[b:b + 1])
        assert torch.equal(alone[0], crowd[b])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_verify_row_is_a_decode_row_over_the_same_keys_to_the_bit(dtype):
    """A tree row attends over the committed rows and its ancestors, listed where they lie; the
    same keys laid out one after another, as they are once a verify pass's path is kept and
    plain decoding reads them, give the same bits. So does a chain row over its rows so far."""
    pool, caches = pool_with(3, 64, [37, 37], dtype=dtype)
    tree, flat = caches
    rows = [tree.pool_start + 37 + r for r in (0, 2, 5)]          # a path of three tree rows, scattered
    for i, r in enumerate(rows):                                   # the kept path, in order, after 37 rows
        for kv in (pool.k, pool.v):
            kv[0, :, flat.pool_start + 37 + i] = kv[0, :, r]
    for kv in (pool.k, pool.v):                                    # the same committed rows
        kv[0, :, flat.pool_start:flat.pool_start + 37] = kv[0, :, tree.pool_start:tree.pool_start + 37]
    q, k, v = projection(1, 9, 3, 64)
    k[0], v[0] = pool.k[0, :, rows[-1]], pool.v[0, :, rows[-1]]     # the row's own K/V, written again as it is
    as_tree = native.attend_rows(q, k, v, pool.k[0], pool.v[0], torch.tensor([rows[-1]]),
                                 torch.tensor([tree.pool_start]), torch.tensor([37]), torch.tensor([0, 3]),
                                 torch.tensor(rows))
    as_decode = native.attend_rows(q, k, v, pool.k[0], pool.v[0], torch.tensor([flat.pool_start + 39]),
                                   torch.tensor([flat.pool_start]), torch.tensor([40]), torch.tensor([0, 0]),
                                   torch.zeros(0, dtype=torch.int64))
    assert torch.equal(as_tree, as_decode)
    flat.length = 39                                               # and as a decode step of the model's plan
    assert torch.equal(decode_plan([flat]).attend(0, q, k, v), as_decode)


def test_threads_split_the_work_without_changing_a_bit():
    pool, caches = pool_with(3, 64, [50, 9, 33, 70, 2, 18])
    q, k, v = projection(6, 9, 3, 64)
    plan = decode_plan(caches)
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
    ok, why = native.available(torch.float16, "cpu")
    assert not ok and "float16" in why
    ok, why = native.available(torch.bfloat16, "cpu", torch.bfloat16)    # a bf16 hybrid's rows: SDPA's
    assert not ok and "fp32 rows" in why
    ok, why = native.available(torch.float32, "meta")
    assert not ok and "meta" in why


def test_without_a_compiler_the_pytorch_form_runs_and_says_why(tmp_path):
    """A fresh interpreter whose CC does not exist: no kernel, the reason, and a model's decode
    step still runs (on the gather and SDPA)."""
    script = (
        "import torch\n"
        "from serving.kernels import decode_attention as native\n"
        "from serving.models.decode_attention import DecodeRows, NativeRows\n"
        "from tests.serving.test_decode_attention import pool_with, projection\n"
        "ok, why = native.available(torch.float32, 'cpu')\n"
        "pool, caches = pool_with(3, 64, [4, 9])\n"
        "q, k, v = projection(2, 9, 3, 64)\n"
        "plan = DecodeRows.plan(caches, torch.float32, 'cpu')\n"
        "print(ok, NativeRows.plan(caches, [1, 1], [None, None], torch.float32, 'cpu'), tuple(plan.attend(0, q, k, v).shape), why)\n")
    env = {"PATH": "/usr/bin:/bin", "CC": str(tmp_path / "no-such-cc"), build.CACHE_ENV: str(tmp_path / "cache")}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120,
                          cwd=str(__import__("pathlib").Path(__file__).parents[2]))
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("False None (2, 576) decode_attention.c did not build or load")
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


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_kept_tree_path_gives_plain_decodings_logits_to_the_bit(tiny_llama, dtype):
    """One verify pass over a tree (the kernel's tree rows), its path kept, then one more row;
    against the same tokens decoded one at a time from the same prompt: every logit equal, bit
    for bit, in fp32 and with bf16 weights (whose products round nothing, but whose next
    product would amplify any difference the attention left)."""
    from tests.serving.conftest import load
    model = load(tiny_llama, dtype)
    pool = KVPool(model.config, 256, model.dtype, "cpu")
    prompt = torch.tensor([5, 17, 42, 99, 3, 250, 7, 311, 64, 12, 40])
    a, b = pool.reserve(64), pool.reserve(64)
    for cache in (a, b):
        model.forward_packed(prompt, torch.arange(11), [cache], [11])
        cache.commit(11)
    # tree rows: 0 root; 1, 2 children of 0; 3 child of 2; 4 child of 1; path 0 -> 2 -> 3
    tokens, depths, parents = [8, 30, 31, 33, 34], [0, 1, 1, 2, 2], [-1, 0, 0, 2, 1]
    mask = torch.zeros(5, 5, dtype=torch.bool)
    for r in range(5):
        p = r
        while p >= 0:
            mask[r, p], p = True, parents[p]
    tree_logits, _ = model.forward_packed(torch.tensor(tokens), 11 + torch.tensor(depths), [a], [5], [mask])
    a.keep([0, 2, 3])
    plain = []
    for t in (8, 31, 33):
        logits, _ = model.forward_packed(torch.tensor([t]), torch.tensor([b.length]), [b], [1])
        b.commit(1)
        plain.append(logits[0])
    assert torch.equal(tree_logits[[0, 2, 3]], torch.stack(plain))
    after_tree, _ = model.forward_packed(torch.tensor([9]), torch.tensor([14]), [a], [1])
    after_plain, _ = model.forward_packed(torch.tensor([9]), torch.tensor([14]), [b], [1])
    assert torch.equal(after_tree, after_plain)
