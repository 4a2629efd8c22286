"""Hybrid targets in batched plain decoding: a request's answer never depends on its neighbours.

The batch runner holds a HybridPool (K/V rows of the full-attention layers + one Gated DeltaNet
state slot per running sequence) and advances every decoding sequence in one batched step.
Each request's greedy ids in a crowd equal its ids alone and the ids of a reference loop over
the model's own forward on its own HybridCache (prefill chunks of 40, then one row a step);
seeded samples too; slots are zeroed for each new sequence and all come back.
"""

from __future__ import annotations


import pytest
import torch

from serving.engine import Engine, StopRule
from serving.engine.batch import BatchRunner
from serving.engine.hybrid_pool import HybridPool
from serving.models import batched
from serving.sampling import PositionalDraws, SamplingParams
from tests.crowd import at_once

GREEDY = SamplingParams(temperature=0)


class Ids:
    def decode(self, ids):
        return " ".join(map(str, ids))


def mixed(n: int):
    """Prompts of 1..70 tokens (several prefill chunks, chunked and stepwise forms), 1..24 new
    tokens, every third request a seeded sample."""
    gen = torch.Generator().manual_seed(5)
    out = []
    for i in range(n):
        prompt = torch.randint(3, 250, (1 + (i * 17) % 70,), generator=gen).tolist()
        sampling = SamplingParams(temperature=0.9, seed=70 + i) if i % 3 == 2 else GREEDY
        out.append((prompt, sampling, StopRule(1 + (i * 7) % 24)))
    return out


def crowd(engine, requests):
    return at_once([lambda r=r: engine.generate(*r) for r in requests])


@pytest.fixture(scope="module")
def hybrid(hf_pairs):
    return hf_pairs["lllf-lllf"][1]


@pytest.fixture(scope="module")
def engine(hybrid):
    engine = Engine(lambda: BatchRunner(hybrid, None, capacity=256, max_running=8), Ids(),
                    chunk_tokens=40).start()
    yield engine
    engine.stop()


@pytest.mark.parametrize("n", [2, 5, 12])
def test_each_hybrid_answer_in_a_batch_equals_its_answer_alone(engine, n):
    assert batched.decodes(engine.scheduler.runner.target)
    requests = mixed(n)
    alone = [engine.generate(*r) for r in requests]
    together = crowd(engine, requests)
    assert [r.token_ids for r in together] == [r.token_ids for r in alone]
    assert max(r.usage.completion_tokens for r in together) > 1
    pool = engine.scheduler.runner.pool
    assert isinstance(pool, HybridPool)
    assert pool.free == [(0, pool.capacity)] and pool.free_slots == list(range(8))


def one_sequence(model, prompt, sampling, rule, chunk: int = 40, seed: int = 0) -> tuple[int, ...]:
    """The reference: the model's own forward on its own cache, chunked prefill, one row a step,
    each token drawn at its position (as the runtime draws)."""
    cache, draws, out = model.new_cache(256), PositionalDraws(sampling.seed if sampling.seed is not None else seed), []
    tokens = torch.tensor(prompt)
    for begin in range(0, len(prompt), chunk):
        end = min(begin + chunk, len(prompt))
        logits, _ = model.forward(tokens[begin:end], torch.arange(begin, end), cache, last_only=True)
        cache.commit(end - begin)
    while len(out) < rule.max_new_tokens:
        out.append(int(draws.choose(logits, sampling, [cache.length])[0]))
        logits, _ = model.forward(torch.tensor(out[-1:]), torch.tensor([cache.length]), cache, last_only=True)
        cache.commit(1)
    return tuple(out)


def test_batched_answers_equal_a_one_sequence_reference(engine, hybrid):
    requests = mixed(6)
    together = crowd(engine, requests)
    assert [r.token_ids for r in together] == [one_sequence(hybrid, *r) for r in requests]


def test_a_slot_is_zeroed_for_each_new_sequence_and_slots_bound_admission(hybrid):
    pool = HybridPool(hybrid.config, 100, 2, hybrid.dtype, "cpu")
    a, b = pool.reserve(10), pool.reserve(10)
    assert (a.slot, b.slot) == (0, 1) and pool.reserve(10) is None     # rows left, no slot
    a.conv.fill_(1.0)
    a.recurrent.fill_(2.0)
    assert pool.conv[0].abs().sum() > 0 and pool.recurrent[0].abs().sum() > 0   # views of the pool
    pool.release(a)
    c = pool.reserve(30)
    assert c.slot == 0 and c.conv.abs().sum() == 0 and c.recurrent.abs().sum() == 0
    layers = len(hybrid.config.linear_layers)
    assert pool.state_bytes() == 2 * layers * (c.conv[0].numel() * 4 + c.recurrent[0].numel() * 4)


def test_a_batched_step_must_be_committed_one_row_at_a_time(hybrid):
    pool = HybridPool(hybrid.config, 64, 2, hybrid.dtype, "cpu")
    caches = [pool.reserve(20), pool.reserve(20)]
    for cache in caches:
        hybrid.forward(torch.tensor([5, 6, 7]), torch.arange(3), cache)
        cache.commit(3)
    batched.decode_step(hybrid, torch.tensor([8, 9]), torch.tensor([3, 3]), caches)
    with pytest.raises(ValueError, match="advanced the state by 1 rows, not 2"):
        caches[0].commit(2)
    caches[1].commit(1)
    assert caches[1].length == 4
