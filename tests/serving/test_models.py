"""Our decoder against the transformers reference on the same tiny checkpoints."""

from __future__ import annotations

import pytest
import torch

from serving.models import KVCache
from serving.tools.tiny import write_tiny
from tests.serving.conftest import load

import transformers  # noqa: E402  (dev dependency: a missing one must fail, not skip)
PROMPT = torch.tensor([5, 17, 42, 99, 3, 250, 7, 311, 64, 12, 400, 8, 77, 200, 33, 21])


def reference_logits(path, dtype=torch.float32, tokens=PROMPT):
    hf = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=dtype).eval()
    with torch.no_grad():
        out = hf(tokens[None], output_hidden_states=True)
    return out.logits[0].float(), out.hidden_states


def our_logits(model, tokens=PROMPT, capture=()):
    cache = model.new_cache(64)
    return model.forward(tokens, torch.arange(len(tokens)), cache, capture=capture)


@pytest.mark.parametrize("arch,rope", [("llama", "none"), ("llama", "llama3"), ("llama", "linear"),
                                       ("llama", "yarn"), ("qwen3", "none")])
def test_logits_match_transformers(tmp_path, arch, rope):
    path = write_tiny(tmp_path / arch, arch=arch, rope_scaling=rope)
    ours, _ = our_logits(load(path))
    ref, _ = reference_logits(path)
    assert ours.dtype == torch.float32 and ours.shape == ref.shape
    torch.testing.assert_close(ours, ref, atol=1e-4, rtol=1e-4)


def test_rope_scaling_changes_logits(tmp_path):
    # guards the test above: scaling must matter at these positions, or it would prove nothing
    plain, _ = our_logits(load(write_tiny(tmp_path / "a", rope_scaling="none")))
    scaled, _ = our_logits(load(write_tiny(tmp_path / "b", rope_scaling="llama3")))
    assert (plain - scaled).abs().max() > 1e-2


def test_sharded_qwen3_matches_transformers_and_captures_layers(tiny_qwen3):
    model = load(tiny_qwen3)
    ours, hidden = our_logits(model, capture=(2, 0))
    ref, states = reference_logits(tiny_qwen3)
    torch.testing.assert_close(ours, ref, atol=1e-4, rtol=1e-4)
    H = model.config.hidden_size
    assert hidden.shape == (len(PROMPT), 2 * H)
    # capture order is the caller's; layer k's output is HF hidden_states[k + 1]
    torch.testing.assert_close(hidden[:, :H], states[3][0], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(hidden[:, H:], states[1][0], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_half_precision_checkpoint_loads_in_half_and_fp32(tmp_path, dtype):
    path = write_tiny(tmp_path / dtype, arch="qwen3", dtype=dtype)
    ref, _ = reference_logits(path, dtype=torch.float32)
    as_fp32, _ = our_logits(load(path, torch.float32))
    torch.testing.assert_close(as_fp32, ref, atol=1e-4, rtol=1e-4)
    model = load(path, getattr(torch, dtype))
    assert model.weight_dtype == getattr(torch, dtype)
    # on CPU bf16 weights are read by packed products and the rest runs in fp32
    # (serving.contract.runtime.compute_dtype); fp16 has no packed products and computes in fp16;
    # K/V rows are kept in the weights' dtype either way (kv_dtype)
    assert model.dtype == (torch.float32 if dtype == "bfloat16" else torch.float16)
    assert model.new_cache(8).k.dtype == model.weight_dtype
    as_half, _ = our_logits(model)
    assert as_half.dtype == torch.float32
    assert (as_half - ref).abs().max() < 0.5
    assert (as_half.argmax(-1) == ref.argmax(-1)).float().mean() > 0.8


def test_bf16_is_nearer_the_exact_forward_than_transformers_in_bf16(tmp_path):
    """Parity in bf16 (docs/serving.md "bf16 on CPU"): the same bf16 checkpoint run exactly
    (transformers in fp32: the bf16 weights widen without loss) is the reference. transformers
    in bf16 rounds every activation to bf16; ours rounds only each product's input and output,
    so its logits must be at least as near the reference, by max and by mean, and pick the same
    greedy token wherever transformers' bf16 does."""
    path = write_tiny(tmp_path / "bf16", arch="llama", dtype="bfloat16")
    exact, _ = reference_logits(path, dtype=torch.float32)
    theirs, _ = reference_logits(path, dtype=torch.bfloat16)
    ours, _ = our_logits(load(path, torch.bfloat16))
    ours_err, their_err = (ours - exact).abs(), (theirs - exact).abs()
    assert ours_err.max() <= their_err.max() and ours_err.mean() <= their_err.mean(), (ours_err.max(), their_err.max())
    agree = theirs.argmax(-1) == exact.argmax(-1)
    assert torch.equal(ours.argmax(-1)[agree], exact.argmax(-1)[agree])


def test_tied_embeddings_share_the_embedding_table(llama_model, tiny_qwen3):
    assert llama_model.config.tie_word_embeddings
    assert llama_model.lm_head_weight.data_ptr() == llama_model.embed_tokens.weight.data_ptr()
    qwen = load(tiny_qwen3)
    assert qwen.lm_head_weight.data_ptr() != qwen.embed_tokens.weight.data_ptr()


def test_embed_and_lm_head_compose_to_forward(llama_model):
    tokens = PROMPT[:1]
    logits, hidden = our_logits(llama_model, tokens, capture=(llama_model.config.num_hidden_layers - 1,))
    assert llama_model.embed(tokens).shape == (1, llama_model.config.hidden_size)
    torch.testing.assert_close(llama_model.lm_head(llama_model.norm(hidden)), logits)


def test_kv_cache_decode_equals_full_forward(llama_model):
    full, _ = our_logits(llama_model)
    cache = llama_model.new_cache(64)
    rows = []
    first, _ = llama_model.forward(PROMPT[:6], torch.arange(6), cache)
    cache.commit(6)
    rows.append(first)
    for i in range(6, len(PROMPT)):
        logits, _ = llama_model.forward(PROMPT[i:i + 1], torch.tensor([i]), cache)
        assert cache.length == i          # forward never moves the length
        cache.commit(1)
        rows.append(logits)
    torch.testing.assert_close(torch.cat(rows), full, atol=1e-5, rtol=1e-5)


def test_last_only_returns_the_last_row(llama_model):
    full, _ = our_logits(llama_model)
    last, _ = llama_model.forward(PROMPT, torch.arange(len(PROMPT)), llama_model.new_cache(64), last_only=True)
    torch.testing.assert_close(last, full[-1:])


def test_tree_mask_and_keep_equal_the_chosen_causal_path(llama_model):
    """Two branches after a shared prefix; keeping one branch equals decoding it causally."""
    prefix, branch_a, branch_b = PROMPT[:5], PROMPT[5:8], torch.tensor([300, 301, 302])
    cache = llama_model.new_cache(64)
    llama_model.forward(prefix, torch.arange(5), cache)
    cache.commit(5)
    # rows: a0 a1 a2 b0 b1 b2 at depths 0..2 each; each branch sees only its own ancestors
    tokens = torch.cat([branch_a, branch_b])
    positions = torch.tensor([5, 6, 7, 5, 6, 7])
    chain = torch.ones(3, 3, dtype=torch.bool).tril()
    tree = torch.zeros(6, 6, dtype=torch.bool)
    tree[:3, :3], tree[3:, 3:] = chain, chain
    tree_logits, _ = llama_model.forward(tokens, positions, cache, tree_mask=tree)
    causal, _ = our_logits(llama_model, torch.cat([prefix, branch_b]))
    torch.testing.assert_close(tree_logits[3:], causal[5:], atol=1e-5, rtol=1e-5)
    cache.keep([3, 4, 5])
    assert cache.length == 8
    after, _ = llama_model.forward(torch.tensor([9]), torch.tensor([8]), cache)
    expected, _ = our_logits(llama_model, torch.cat([prefix, branch_b, torch.tensor([9])]))
    torch.testing.assert_close(after[0], expected[-1], atol=1e-5, rtol=1e-5)


def test_kv_cache_rejects_overflow_and_bad_truncate():
    cache = KVCache(num_layers=1, num_kv_heads=1, head_dim=2, capacity=4)
    cache.write(0, torch.zeros(1, 3, 2), torch.zeros(1, 3, 2))
    cache.commit(3)
    with pytest.raises(ValueError, match="capacity 4"):
        cache.write(0, torch.zeros(1, 2, 2), torch.zeros(1, 2, 2))
    with pytest.raises(ValueError):
        cache.truncate(5)
    cache.truncate(1)
    assert cache.length == 1


def test_the_lm_head_carries_gradients_to_what_is_trained_through_it():
    """A draft is trained through the target's frozen head (serving/tools/train_draft.py). oneDNN's
    product has no backward and drops gradients without an error, so a draft trained through it
    learned nothing and accepted nothing: the head must give the hidden the same gradient as
    F.linear, and the same logits in inference."""
    from serving.models.cpu_gemm import head
    weight = torch.randn(512, 64)
    hidden = torch.randn(5, 64, requires_grad=True)
    head(hidden, weight).square().sum().backward()
    reference = hidden.detach().clone().requires_grad_()
    torch.nn.functional.linear(reference, weight).square().sum().backward()
    assert hidden.grad is not None and torch.allclose(hidden.grad, reference.grad, atol=1e-4)
    with torch.no_grad():
        assert torch.allclose(head(hidden, weight), reference @ weight.T, atol=1e-4)


def test_the_head_runs_on_a_packed_copy_beside_the_dense_table(llama_model):
    """On CPU at fp32 and bf16 the head's product runs on a oneDNN-packed copy (half the time of the dense
    matrix at 8 rows), while the dense [V, H] table stays what the embedding and the drafters
    read; the copy is counted with the weights (serving.contract.runtime.head_copies) and gives
    the dense product's logits, row for row alone and in a batch."""
    from serving import memory
    from serving.contract.runtime import head_copies
    packed, dense = llama_model.lm_head_packed, llama_model.lm_head_weight
    assert packed is not None and packed.is_mkldnn and head_copies("cpu", "float32") == 1
    assert memory.parameter_bytes([llama_model]) == (sum(p.numel() * p.element_size() for p in llama_model.parameters())
                                                     + dense.numel() * dense.element_size())
    hidden = torch.randn(8, dense.shape[1])
    with torch.inference_mode():
        batch = llama_model.lm_head(hidden)
        alone = torch.cat([llama_model.lm_head(hidden[i:i + 1]) for i in range(8)])
    torch.testing.assert_close(batch, hidden @ dense.T, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(alone, batch, atol=1e-4, rtol=1e-4)
    assert head_copies("cuda", "float32") == head_copies("cuda", "bfloat16") == head_copies("cpu", "float16") == 0
    assert head_copies("cpu", "bfloat16") == 1


def test_products_of_few_rows_may_run_padded_and_give_the_same_logits(llama_model):
    """pack_weights measures once whether this CPU runs products of 1-3 rows faster padded to 4
    (cpu_gemm.small_rows: on a 2-core AMD EPYC it does, 44.7 against 39.5 ms a SmolLM2 step);
    either way the rows' logits are the unpadded ones, and /server_info's kernels say which runs
    with the two passes' milliseconds it was decided on."""
    from serving.kernel_report import target_kernels
    from serving.models.cpu_gemm import Linear, product
    linears = [m for m in llama_model.modules() if isinstance(m, Linear) and m.packed]
    chosen = {m.min_rows for m in linears} | {llama_model.head_min_rows}
    assert len(linears) > 0 and len(chosen) == 1
    report = target_kernels(llama_model)
    assert report["products"] == ("oneDNN packed; fewer than 4 rows padded to 4" if chosen == {4} else "oneDNN packed")
    assert len(report["products_ms_1_vs_4_rows"]) == 2
    layer = linears[0]
    rows = torch.randn(3, layer.in_features)
    for m in (1, 2, 3):
        alone = product(rows[:m], layer.weight, layer.bias, 1)
        padded = product(rows[:m], layer.weight, layer.bias, 4)
        assert padded.shape == alone.shape
        torch.testing.assert_close(padded, alone, atol=1e-5, rtol=1e-5)
    tokens = PROMPT[:5]
    try:
        logits = {}
        for pad in (1, 4):
            llama_model.pad_products(pad)
            cache = llama_model.new_cache(64)
            llama_model.forward(tokens[:4], torch.arange(4), cache)
            cache.commit(4)
            logits[pad] = llama_model.forward(tokens[4:], torch.arange(4, 5), cache)[0]   # one row: padded or not
        torch.testing.assert_close(logits[4], logits[1], atol=1e-4, rtol=1e-4)
        assert logits[4].argmax(-1).tolist() == logits[1].argmax(-1).tolist()
    finally:
        llama_model.pad_products(min(chosen))
