"""Every method in METHODS under continuous batching: answers in a crowd equal the answers alone.

The batch runner runs one batched speculative round for every decoding sequence
(serving.speculative.lane): one draft pass over all blocks, one target forward over all trees.
Alone, a request's rounds hold only its tree; in a crowd of 16 its tree shares the passes with
up to 15 others of other depths (sequences near max_tokens draft less, probes a full block,
adaptive controllers choose per batch size), so one comparison covers the ragged packing:
greedy requests, and seeded sampled ones (their draws are keyed by position,
serving.sampling.PositionalDraws). Below: the two packed passes against their one-sequence
forms. Tiny fp32 targets with distilled drafts.
"""

import queue

import pytest
import torch

from serving.engine import Delta, Engine, GenerationRequest
from serving.engine.batch import BatchRunner
from serving.engine.kv_pool import KVPool
from serving.engine.stops import StopRule
from serving.models import batched
from serving.models.tokenizer import Tokenizer
from serving.sampling import SamplingParams
from serving.speculative import METHODS, SpecOptions, build
from serving.speculative.dflash import DFlashDrafter, load_model
from serving.speculative.tree import chain_tree, heap_tree, visibility
from serving.tools.draft_files import draft_config, random_model, save_draft
from tests.crowd import at_once

GREEDY = SamplingParams(temperature=0)
TEXTS = ["The capital of France is", "def fibonacci(n):", "Servers listen on a port,", "A"]
# each method at its defaults, plus a short chain and a tiny tree where the method takes them
SETTINGS = [(name, None, None) for name in METHODS] + [
    (name, 4, None) for name, spec in METHODS.items() if spec.speculative and not spec.takes_budget] + [
    (name, None, 3) for name, spec in METHODS.items() if spec.takes_budget]


def requests(tokenizer, eos: int) -> list[tuple[list[int], SamplingParams, StopRule]]:
    gen = torch.Generator().manual_seed(3)
    prompts = [tokenizer.encode(t, prompt=False) for t in TEXTS]
    prompts += [torch.randint(3, tokenizer.vocab_size, (n,), generator=gen).tolist() for n in (1, 9, 40, 70)]
    out = []
    for i in range(16):
        stop_ids = frozenset({eos}) if i % 3 == 0 else frozenset()
        sampling = SamplingParams(temperature=0.9, seed=40 + i) if i % 4 == 3 else GREEDY
        out.append((prompts[i % len(prompts)], sampling, StopRule(1 + (i * 7) % 30, stop_ids=stop_ids)))
    return out


def engine_for(target, tokenizer, name, draft, block, budget, adaptive=False) -> Engine:
    method = build(METHODS[name], target, SpecOptions(draft_path=str(draft), block_size=block, budget=budget))
    return Engine(lambda: BatchRunner(target, method, capacity=512, max_running=16, adaptive=adaptive), tokenizer,
                  chunk_tokens=16).start()


def ask(engine: Engine, prompt, sampling, rule, probe=False):
    """engine.generate, optionally as a /health_generate probe (its first round drafts a full block)."""
    done = queue.Queue()
    engine.submit(GenerationRequest(prompt, sampling, rule, lambda e: None if isinstance(e, Delta) else done.put(e),
                                    probe=probe))
    return done.get(timeout=120)


def crowd(engine: Engine, cases, probes=()) -> list:
    return at_once([lambda i=i: ask(engine, *cases[i], i in probes) for i in range(len(cases))])


@pytest.fixture(scope="module")
def plain_answers(tiny_dirs, targets) -> dict:
    """Each arch's 16 cases answered one at a time by plain decoding: what every method must give."""
    out = {}
    for arch in ("llama", "qwen3"):
        tokenizer = Tokenizer.from_dir(tiny_dirs[arch])
        engine = Engine(lambda arch=arch: BatchRunner(targets[arch], None, capacity=512), tokenizer).start()
        try:
            out[arch] = [(r.token_ids, r.finish_reason) for r in map(lambda c: engine.generate(*c),
                         requests(tokenizer, eos=tokenizer.eos_ids and min(tokenizer.eos_ids) or 0))]
        finally:
            engine.stop()
    return out


@pytest.mark.parametrize("name, block, budget", SETTINGS)
@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_answers_in_a_crowd_equal_answers_alone(arch, name, block, budget, tiny_dirs, targets,
                                                distilled_drafts, plain_answers):
    tokenizer = Tokenizer.from_dir(tiny_dirs[arch])
    engine = engine_for(targets[arch], tokenizer, name, distilled_drafts[arch], block, budget)
    try:
        cases = requests(tokenizer, eos=tokenizer.eos_ids and min(tokenizer.eos_ids) or 0)
        alone = [engine.generate(*case) for case in cases]
        together = crowd(engine, cases)
        assert [(r.token_ids, r.finish_reason) for r in alone] == plain_answers[arch]
        assert [(r.token_ids, r.finish_reason) for r in together] == plain_answers[arch]
        if METHODS[name].speculative:   # rounds really committed several tokens, and really ran batched
            assert max(r.usage.accept_length for r in alone) > 1.0
            assert max(r.usage.accept_length for r in together) > 1.0
            lane = engine.runner.spec
            # a fixed setting: every round speculates; rounds of several sequences ran (their time was
            # spent, whether or not a request's last tokens kept the round from being measured)
            assert any(key > 1 and c.spent > 0 for key, c in lane.controllers.items())
            assert engine.runner.prefix.cached_tokens > 0   # the crowd's prompts (and features) came from the cache
    finally:
        engine.stop()


@pytest.mark.parametrize("name", [name for name, spec in METHODS.items() if spec.speculative])
def test_adaptive_crowd_with_probes_equals_answers_alone(name, tiny_dirs, targets, distilled_drafts, plain_answers):
    """Adaptive controllers per batch size switch settings between rounds, and two probes force a
    full block beside neighbours drafting less: every answer still equals its answer alone."""
    tokenizer = Tokenizer.from_dir(tiny_dirs["llama"])
    engine = engine_for(targets["llama"], tokenizer, name, distilled_drafts["llama"], None, None, adaptive=True)
    try:
        cases = requests(tokenizer, eos=tokenizer.eos_ids and min(tokenizer.eos_ids) or 0)
        alone = [ask(engine, *case) for case in cases]
        together = crowd(engine, cases, probes={2, 9})
        assert [(r.token_ids, r.finish_reason) for r in alone] == plain_answers["llama"]
        assert [(r.token_ids, r.finish_reason) for r in together] == plain_answers["llama"]
        by_batch = engine.runner.server_args["speculative_settings_by_batch"]
        assert "1" in by_batch and len(by_batch) > 1      # measured and chosen per batch size
        measured = [s for s in by_batch["1"]["settings"] if s["rounds"] > 0]
        assert len(measured) >= 2   # alone: the controller climbed off plain, so settings switched
    finally:
        engine.stop()


def test_packed_trees_equal_each_tree_alone(targets):
    """batched.forward over a tree, a chain and a single row of three sequences (different
    prefixes) gives each the logits, features and K/V of its own CausalLM.forward."""
    target, gen = targets["llama"], torch.Generator().manual_seed(0)
    vocab = target.config.vocab_size
    tree = heap_tree(7, [[-0.1, -1.0, -2.0], [-0.2, -1.5, -3.0], [-0.3, -0.9, -4.0]],
                     torch.randint(3, vocab, (3, 3), generator=gen).tolist(), 6)
    trees = [tree, chain_tree(9, [11, 12, 13]), chain_tree(5, [])]
    prefixes = [torch.randint(3, vocab, (n,), generator=gen) for n in (5, 17, 1)]
    layers = (1, 2)

    def caches(pool):
        out = [pool.reserve(40) for _ in prefixes]
        for cache, prefix in zip(out, prefixes):
            target.forward(prefix, torch.arange(len(prefix)), cache)
            cache.commit(len(prefix))
        return out

    def rows(t, cache):
        return torch.tensor(t.tokens), torch.tensor(t.positions(cache.length))

    packed_caches = caches(KVPool(target.config, 200, torch.float32, "cpu"))
    inputs = [rows(t, c) for t, c in zip(trees, packed_caches)]
    logits, hidden = batched.forward(target, torch.cat([i[0] for i in inputs]), torch.cat([i[1] for i in inputs]),
                                     packed_caches, [len(t) for t in trees],
                                     [None if t.is_chain else visibility(t) for t in trees], capture=layers)
    alone_caches, begin = caches(KVPool(target.config, 200, torch.float32, "cpu")), 0
    for t, cache, packed_cache, (tokens, positions) in zip(trees, alone_caches, packed_caches, inputs):
        one, features = target.forward(tokens, positions, cache, tree_mask=None if t.is_chain else visibility(t),
                                       capture=layers)
        n, end = len(t), cache.length + len(t)
        torch.testing.assert_close(logits[begin:begin + n], one, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(hidden[begin:begin + n], features, atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(packed_cache.k[:, :, :end], cache.k[:, :, :end], atol=1e-4, rtol=1e-4)
        begin += n


def test_batched_draft_pass_equals_one_sequence_drafts(tiny_dirs, targets, tmp_path):
    """DFlashDrafter.propose over three sequences (contexts of 3, 11 and 20 positions, depths 1,
    4 and 7) equals its pass over each alone, on a draft with a causal sliding-window
    layer beside a full-attention one."""
    import json

    target = targets["llama"]
    config = {**draft_config(json.loads((tiny_dirs["llama"] / "config.json").read_text())),
              "layer_types": ["sliding_attention", "full_attention"], "sliding_window": 4, "use_sliding_window": True}
    path = save_draft(random_model(config, seed=2), config, tmp_path / "draft")
    many, gen = DFlashDrafter(load_model(path, torch.float32, "cpu"), target), torch.Generator().manual_seed(1)
    shapes = [(3, 1, 17), (11, 4, 23), (20, 7, 31)]          # context length, depth, bonus token
    features = [torch.randn(n, many.feature_width, generator=gen) for n, _, _ in shapes]
    pool = many.pool(40 * len(shapes))
    contexts = [many.context(pool, 40 * i, 40) for i in range(len(shapes))]
    for context, f in zip(contexts, features):
        many.extend(context, f[:2])                          # absorbed in two pieces, as rounds do
        many.extend(context, f[2:])
    proposals = many.propose(contexts, [b for _, _, b in shapes], [d for _, d, _ in shapes])
    for (n, depth, bonus), f, proposal in zip(shapes, features, proposals):
        alone = many.context(many.pool(64), 0, 64)
        many.extend(alone, f)
        torch.testing.assert_close(proposal, many.propose([alone], [bonus], [depth])[0], atol=1e-4, rtol=1e-4)
