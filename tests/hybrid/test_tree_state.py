"""Tree rows on a hybrid: every row sees only its ancestors, in attention and in the recurrent state.

Each tree row's logits equal a plain run of its root-to-row path; keeping a path (or a chain
prefix) leaves exactly the state a plain run of the accepted tokens leaves.
"""

import json

import pytest
import torch

from serving.speculative.tree import chain_tree, heap_tree, visibility
from serving.tools.tiny_hybrid import hybrid_config

TOL = 1e-5


@pytest.fixture(scope="module")
def model(hf_pairs):
    return hf_pairs["lllf-lllf"][1]


def random_tree(seed: int, nodes: int = 14, depth: int = 6):
    g = torch.Generator().manual_seed(seed)
    logp = torch.randn(depth, 4, generator=g).log_softmax(-1).sort(-1, descending=True).values
    tokens = torch.randint(0, 256, (depth, 4), generator=g)
    return heap_tree(int(torch.randint(0, 256, (1,), generator=g)), logp.tolist(), tokens.tolist(), nodes)


def prefilled(model, prompt):
    cache = model.new_cache(128)
    model.forward(prompt, torch.arange(len(prompt)), cache)
    cache.commit(len(prompt))
    return cache


def path_rows(tree, row):
    rows = [row]
    while tree.parents[rows[-1]] >= 0:
        rows.append(tree.parents[rows[-1]])
    return rows[::-1]


def plain_logits(model, ids):
    logits, _ = model.forward(ids, torch.arange(len(ids)), model.new_cache(128))
    return logits


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_each_tree_row_equals_its_path_alone(model, seed):
    prompt = torch.randint(0, 256, (9 + seed,), generator=torch.Generator().manual_seed(seed))
    tree = random_tree(seed)
    assert not tree.is_chain and max(tree.depths) >= 3
    n = len(prompt)
    logits, _ = model.forward(torch.tensor(tree.tokens), torch.tensor(tree.positions(n)),
                              prefilled(model, prompt), tree_mask=visibility(tree))
    for row in range(len(tree)):
        path = torch.tensor([tree.tokens[r] for r in path_rows(tree, row)])
        want = plain_logits(model, torch.cat([prompt, path]))[-1]
        assert (logits[row] - want).abs().max().item() < TOL, row


@pytest.mark.parametrize("seed", [0, 3])
def test_keeping_a_path_leaves_the_plain_state(model, seed):
    prompt = torch.randint(0, 256, (7,), generator=torch.Generator().manual_seed(seed))
    tree = random_tree(seed)
    deepest = max(range(len(tree)), key=lambda r: tree.depths[r])
    path = path_rows(tree, deepest)
    cache = prefilled(model, prompt)
    model.forward(torch.tensor(tree.tokens), torch.tensor(tree.positions(7)), cache, tree_mask=visibility(tree))
    cache.keep(path)
    accepted = [tree.tokens[r] for r in path]
    nxt = torch.tensor([5, 6, 7])
    after, _ = model.forward(nxt, torch.arange(cache.length, cache.length + 3), cache)
    want = plain_logits(model, torch.cat([prompt, torch.tensor(accepted), nxt]))[-3:]
    assert (after - want).abs().max().item() < TOL


@pytest.mark.parametrize("accepted", [1, 4, 9])
def test_keeping_a_chain_prefix_leaves_the_plain_state(model, accepted):
    """DFlash: verify a block of 9 causally, commit only the accepted prefix."""
    prompt = torch.randint(0, 256, (12,), generator=torch.Generator().manual_seed(accepted))
    block = chain_tree(3, [9, 27, 81, 243, 1, 2, 4, 8])
    cache = prefilled(model, prompt)
    model.forward(torch.tensor(block.tokens), torch.tensor(block.positions(12)), cache)
    cache.keep(list(range(accepted)))
    nxt = torch.tensor([11, 12])
    after, _ = model.forward(nxt, torch.arange(cache.length, cache.length + 2), cache)
    want = plain_logits(model, torch.cat([prompt, torch.tensor(block.tokens[:accepted]), nxt]))[-2:]
    assert (after - want).abs().max().item() < TOL


def test_uncommitted_forwards_leave_the_state_alone(model):
    prompt = torch.randint(0, 256, (10,), generator=torch.Generator().manual_seed(5))
    cache = prefilled(model, prompt)
    before = cache.recurrent.clone(), cache.conv.clone()
    model.forward(torch.tensor([1, 2, 3]), torch.arange(10, 13), cache)   # staged, never committed
    assert torch.equal(cache.recurrent, before[0]) and torch.equal(cache.conv, before[1])
    nxt, _ = model.forward(torch.tensor([4]), torch.tensor([10]), cache)
    assert (nxt[-1] - plain_logits(model, torch.cat([prompt, torch.tensor([4])]))[-1]).abs().max() < TOL


def test_a_chunked_chain_commits_a_prefix_by_recomputing_it(model):
    prompt = torch.randint(0, 256, (80,), generator=torch.Generator().manual_seed(6))
    cache = model.new_cache(128)
    model.forward(prompt, torch.arange(80), cache)          # chunked: only the final state is staged
    cache.keep(list(range(70)))
    nxt, _ = model.forward(prompt[70:72], torch.arange(70, 72), cache)
    assert (nxt - plain_logits(model, prompt[:72])[-2:]).abs().max().item() < TOL


def test_a_last_only_prefill_keeps_only_the_last_window_and_commits_as_a_full_one(model):
    """A caller reading the last row's logits commits every row: the chunked chain's per-row
    inputs and replay tensors are not kept past the forward, and the committed state is the same."""
    prompt = torch.randint(0, 256, (80,), generator=torch.Generator().manual_seed(7))
    full, last = model.new_cache(128), model.new_cache(128)
    model.forward(prompt, torch.arange(80), full)
    logits, _ = model.forward(prompt, torch.arange(80), last, last_only=True)
    kernel = model.config.linear.conv_kernel
    for inputs, _, replay in last.staged:
        assert replay is None and inputs.shape[0] == kernel - 1
        assert inputs.untyped_storage().nbytes() == inputs.numel() * inputs.element_size()   # a copy, not a view
    with pytest.raises(ValueError, match="last_only"):
        last.keep(list(range(70)))
    full.commit(80)
    last.commit(80)
    assert torch.equal(last.conv, full.conv) and torch.equal(last.recurrent, full.recurrent)
    assert (logits - plain_logits(model, prompt)[-1:]).abs().max().item() < TOL


def test_a_recurrent_state_refuses_what_it_cannot_do(model):
    prompt = torch.randint(0, 256, (40,), generator=torch.Generator().manual_seed(6))
    cache = model.new_cache(64)
    with pytest.raises(ValueError, match="nothing staged"):
        cache.commit(1)
    model.forward(prompt, torch.arange(40), cache)
    cache.commit(40)
    with pytest.raises(ValueError, match="cannot roll back"):
        cache.truncate(20)
    cache.truncate(0)
    assert cache.length == 0 and not cache.recurrent.any() and not cache.conv.any()


def test_the_staged_bench_counts_what_a_forward_leaves_in_the_cache(model, tmp_path, capsys):
    """serving.bench.hybrid_staged: a prefill layer leaves its last conv window and final state
    (exactly), a verify forward of the same rows its per-row tensors too."""
    from serving.bench import hybrid_staged

    L = model.config.linear
    prefill = hybrid_staged.staged_bytes(model.config, 40, torch.float32, prefixes=False)
    assert prefill == ((L.conv_kernel - 1) * L.conv_dim + L.num_value_heads * L.key_head_dim * L.value_head_dim) * 4
    assert hybrid_staged.staged_bytes(model.config, 40, torch.float32, prefixes=True) > prefill + 40 * L.conv_dim * 4
    (tmp_path / "config.json").write_text(json.dumps(hybrid_config(256, "float32", None, 1, 2)))
    assert hybrid_staged.main(["--model", str(tmp_path), "--rows", "40"]) == 0
    assert "prefill (last_only)" in capsys.readouterr().out
