"""Continuous batching on a tiny real model: a request's answer never depends on its neighbours.

The engine runs the batch runner (KV pool, chunked prefill, one batched decode step per round);
each request's greedy ids in a crowd of 1..16 equal its ids alone, seeded samples too; a pool
that is full makes requests wait (none lost), a full queue refuses, a cancelled request frees
its rows, and a request that can never fit is refused up front.
"""

from __future__ import annotations

import queue
import threading

import pytest
import torch

from serving.engine import Delta, Engine, EngineBusy, Failed, Finished, GenerationRequest, RequestTooLarge, StopRule
from serving.engine.batch import BatchRunner
from serving.engine.kv_pool import KVPool
from serving.engine.prefix_cache import PrefixCache
from serving.sampling import SamplingParams
from serving.server.metrics import Metrics

from .test_engine import reference_greedy

GREEDY = SamplingParams(temperature=0)


def batch_engine(model, tokenizer, max_running=16, rows=None, chunk=8, max_queued=256) -> Engine:
    return Engine(lambda: BatchRunner(model, None, capacity=512, max_running=max_running, max_total_tokens=rows),
                  tokenizer, max_queued=max_queued, chunk_tokens=chunk).start()


def mixed_requests(n: int) -> list[tuple[list[int], SamplingParams, StopRule]]:
    """Prompts of 1..60 tokens (several prefill chunks), 1..23 new tokens, stop ids, seeded samples."""
    out = []
    for i in range(n):
        prompt = [(11 * i + 7 * j) % 500 + 3 for j in range(1 + (i * 13) % 60)]
        sampling = SamplingParams(temperature=0.8, seed=100 + i) if i % 3 == 2 else GREEDY
        stop_ids = frozenset({(i * 37) % 500 + 3}) if i % 4 == 1 else frozenset()
        out.append((prompt, sampling, StopRule(1 + (i * 5) % 23, stop_ids=stop_ids)))
    return out


def crowd(engine: Engine, requests) -> list:
    """Submit all at once (threads), wait for every answer."""
    results = [None] * len(requests)

    def ask(i):
        results[i] = engine.generate(*requests[i])

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(requests))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    return results


def metric_values(text: bytes) -> dict[str, float]:
    return {line.split(" ")[0]: float(line.split(" ")[1]) for line in text.decode().splitlines()
            if line and not line.startswith("#")}


@pytest.fixture(scope="module")
def engine(llama_model, llama_tokenizer):
    engine = batch_engine(llama_model, llama_tokenizer)
    yield engine
    engine.stop()


@pytest.mark.parametrize("n", [1, 2, 5, 16])
def test_each_answer_in_a_batch_equals_its_answer_alone(engine, n):
    requests = mixed_requests(n)
    alone = [engine.generate(*r) for r in requests]
    together = crowd(engine, requests)
    assert [r.token_ids for r in together] == [r.token_ids for r in alone]
    assert [r.finish_reason for r in together] == [r.finish_reason for r in alone]
    assert engine.scheduler.runner.pool.free == [(0, engine.scheduler.runner.pool.capacity)]


def test_batched_greedy_matches_a_no_cache_argmax_loop(engine, llama_model):
    prompts = [[5, 17, 42, 99, 3], [8] * 30, [400, 2]]
    together = crowd(engine, [(p, GREEDY, StopRule(12)) for p in prompts])
    for prompt, result in zip(prompts, together):
        assert list(result.token_ids) == reference_greedy(llama_model, prompt, 12)
        assert result.usage.rounds == 11 and result.usage.completion_tokens == 12


def test_a_full_pool_makes_requests_wait_and_none_is_lost(llama_model, llama_tokenizer):
    # 60 pool rows: each request below reserves 5 + 20 rows, so at most two run at once
    small = batch_engine(llama_model, llama_tokenizer, rows=60)
    try:
        requests = [([5, 17, 42, 99, i + 3], GREEDY, StopRule(20)) for i in range(6)]
        alone = [small.generate(*r).token_ids for r in requests]
        peak = []
        watcher = threading.Thread(target=lambda: [peak.append(small.running) or threading.Event().wait(0.002)
                                                   for _ in range(300)])
        watcher.start()
        together = crowd(small, requests)
        watcher.join()
        assert [r.token_ids for r in together] == alone
        assert max(peak) == 2
        with pytest.raises(RequestTooLarge):
            small.submit(GenerationRequest([5] * 30, GREEDY, StopRule(31), lambda e: None))
    finally:
        small.stop()


def test_a_full_queue_refuses_and_a_cancelled_request_frees_its_rows(llama_model, llama_tokenizer):
    one = batch_engine(llama_model, llama_tokenizer, max_running=1, max_queued=1)
    try:
        events: queue.Queue = queue.Queue()
        long = GenerationRequest([5, 17, 42], GREEDY, StopRule(400), events.put)
        one.submit(long)
        assert isinstance(events.get(timeout=30), Delta)                    # it runs
        one.submit(GenerationRequest([5], GREEDY, StopRule(2), lambda e: None))   # it waits
        with pytest.raises(EngineBusy):
            one.submit(GenerationRequest([5], GREEDY, StopRule(2), lambda e: None))
        gauges = metric_values(Metrics().render(one))
        assert gauges["serving_num_running_reqs"] == 1 and gauges["serving_queue_depth"] == 1
        assert gauges["serving_kv_pool_used_tokens"] == 3 + 400                  # prompt + max_tokens
        assert gauges["serving_kv_pool_tokens"] == one.scheduler.runner.pool.capacity
        long.cancelled.set()
        while not isinstance(event := events.get(timeout=30), Finished):
            pass
        assert event.finish_reason == "abort" and len(event.token_ids) < 400
        assert isinstance(one.generate([5], GREEDY, StopRule(2)), Finished)
        assert one.scheduler.runner.pool.free_tokens == one.scheduler.runner.pool.capacity
    finally:
        one.stop()


def test_pool_ranges_are_reused_and_merged(llama_model):
    pool = KVPool(llama_model.config, 100, llama_model.dtype, "cpu")
    a, b, c = pool.reserve(30), pool.reserve(30), pool.reserve(30)
    assert pool.reserve(20) is None and pool.free == [(90, 100)]
    pool.release(b)
    assert pool.reserve(31) is None
    pool.release(a)
    assert pool.free == [(0, 60), (90, 100)]
    d = pool.reserve(50)
    assert d.capacity == 50 and d.k.data_ptr() == pool.k.data_ptr()   # a view into the pool
    pool.release(c)
    pool.release(d)
    assert pool.free == [(0, 100)]


def test_a_prompt_that_breaks_the_packed_prefill_fails_alone(engine, llama_model):
    """Prompts are prefilled together in one pass; a prompt holding a token id the model does
    not have fails that pass, and then only itself: the others are prefilled one by one and
    answer as they do alone."""
    bad = ([5, llama_model.config.vocab_size + 7, 9], GREEDY, StopRule(4))
    good = [([5, 17, 42, 99, 3], GREEDY, StopRule(6)), ([8] * 20, GREEDY, StopRule(6))]
    alone = [engine.generate(*r).token_ids for r in good]
    results = crowd(engine, [good[0], bad, good[1]])
    assert isinstance(results[1], Failed)
    assert [r.token_ids for r in (results[0], results[2])] == alone
    assert engine.scheduler.runner.pool.free == [(0, engine.scheduler.runner.pool.capacity)]


def test_a_shared_prompt_prefix_is_copied_not_computed(llama_model, llama_tokenizer):
    """The second prompt starting with the first's 20 tokens gets its first 16 (two blocks) from
    the prefix cache, and still answers as an argmax loop without any cache does; a prompt that
    differs in its first token reuses nothing."""
    engine = batch_engine(llama_model, llama_tokenizer)
    try:
        prefix = engine.scheduler.runner.prefix
        shared = [(7 * j) % 500 + 3 for j in range(20)]
        first, second, other = shared + [11, 12], shared + [40, 41, 42], [4] + shared[1:] + [40]
        assert engine.generate(first, GREEDY, StopRule(6)).token_ids == tuple(reference_greedy(llama_model, first, 6))
        before = prefix.cached_tokens
        assert list(engine.generate(second, GREEDY, StopRule(6)).token_ids) == reference_greedy(llama_model, second, 6)
        assert prefix.cached_tokens - before == 16
        before = prefix.cached_tokens
        assert list(engine.generate(other, GREEDY, StopRule(6)).token_ids) == reference_greedy(llama_model, other, 6)
        assert prefix.cached_tokens == before
        assert metric_values(Metrics().render(engine))["serving_prefix_cache_hit_ratio"] == prefix.hit_rate > 0
    finally:
        engine.stop()


def test_without_the_prefix_cache_nothing_is_stored_and_answers_are_the_same(llama_model, llama_tokenizer):
    """--disable-radix-cache: the runner allocates no prefix store (serving.memory measures 0
    bytes of it), a prompt sharing another's first 20 tokens is computed, and both answer as an
    argmax loop without any cache does."""
    engine = Engine(lambda: BatchRunner(llama_model, None, capacity=512, prefix_cache=False),
                    llama_tokenizer, chunk_tokens=8).start()
    try:
        runner = engine.scheduler.runner
        assert runner.prefix is None and runner.info().memory["prefix_cache_bytes"] == 0
        shared = [(7 * j) % 500 + 3 for j in range(20)]
        for prompt in (shared + [11, 12], shared + [40, 41, 42]):
            assert list(engine.generate(prompt, GREEDY, StopRule(6)).token_ids) == reference_greedy(llama_model,
                                                                                                    prompt, 6)
        assert metric_values(Metrics().render(engine))["serving_prefix_cache_hit_ratio"] == 0
    finally:
        engine.stop()


def test_the_prefix_cache_is_bounded_and_evicts_the_least_recent(llama_model):
    pool = KVPool(llama_model.config, 96, llama_model.dtype, "cpu")
    view = pool.reserve(64)
    g = torch.Generator().manual_seed(0)
    for rows in (view.k, view.v):          # known values: the pool's own memory is uninitialised (may hold NaN)
        rows[:, :, :32].copy_(torch.randn(rows[:, :, :32].shape, generator=g))
    view.commit(32)
    cache = PrefixCache.for_model(llama_model.config, llama_model.kv_dtype, llama_model.dtype, "cpu", max_blocks=5)
    size = cache.store_bytes()
    assert size == 2 * view.k[:, :, :40].numel() * view.k.element_size()   # 5 blocks x 8 rows of K and V
    a, b = list(range(3, 35)), list(range(100, 132))          # 4 blocks each
    cache.store(a, view, None)
    assert len(cache.lookup(a + [1])) == 4
    cache.store(b, view, None)                                 # 8 blocks > 5: a's oldest go first
    assert len(cache.blocks) == 5 and cache.lookup(a + [1]) == [] and len(cache.lookup(b + [1])) == 4
    assert cache.store_bytes() == size                         # evicted blocks' slots are reused
    copied = pool.reserve(32)
    cache.copy(cache.lookup(b + [1])[:2], copied)
    assert copied.length == 16 and torch.equal(copied.k[:, :, :16], view.k[:, :, :16])
    assert torch.equal(copied.v[:, :, :16], view.v[:, :, :16])
