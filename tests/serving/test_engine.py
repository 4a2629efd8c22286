"""Engine + the batch runner on a tiny real model: greedy equals a no-cache argmax loop, seeds, stops."""

from __future__ import annotations

import threading

import pytest
import torch

from serving.engine import Engine, EngineBusy, Failed, Finished, GenerationRequest, StopRule
from serving.engine.build import runner_factory
from serving.sampling import PositionalDraws, SamplingParams
from tests.serving.fake_runner import FakeRunner

GREEDY = SamplingParams(temperature=0)
PROMPT = [5, 17, 42, 99, 3]


@pytest.fixture(scope="module")
def engine(llama_model, llama_tokenizer):
    engine = Engine(runner_factory(llama_model, 256, seed=0), llama_tokenizer).start()
    yield engine
    engine.stop()


def reference_greedy(model, prompt, n):
    """Argmax loop re-running the whole sequence each step (no KV cache reuse)."""
    ids = list(prompt)
    for _ in range(n):
        logits, _ = model.forward(torch.tensor(ids), torch.arange(len(ids)), model.new_cache(len(ids)))
        ids.append(int(logits[-1].argmax()))
    return ids[len(prompt):]


def reference_sampled(model, prompt, n, params):
    """The same no-cache loop drawing each token with the seeded per-position draws."""
    draws, ids = PositionalDraws(params.seed), list(prompt)
    for _ in range(n):
        logits, _ = model.forward(torch.tensor(ids), torch.arange(len(ids)), model.new_cache(len(ids)))
        ids.append(int(draws.choose(logits[-1:], params, [len(ids)])[0]))
    return ids[len(prompt):]


def test_greedy_matches_a_no_cache_argmax_loop(engine, llama_model):
    result = engine.generate(PROMPT, GREEDY, StopRule(12))
    assert isinstance(result, Finished) and result.finish_reason == "length"
    assert list(result.token_ids) == reference_greedy(llama_model, PROMPT, 12)
    assert result.text == engine.tokenizer.decode(list(result.token_ids))
    assert (result.usage.prompt_tokens, result.usage.completion_tokens) == (5, 12)
    assert result.usage.rounds == 11 and result.usage.accept_length == 1.0


def test_sampling_with_a_seed_is_reproducible(engine, llama_model):
    params = SamplingParams(temperature=1.0, seed=1234)
    other = SamplingParams(temperature=1.0, seed=99)
    first = engine.generate(PROMPT, params, StopRule(24)).token_ids
    again = engine.generate(PROMPT, params, StopRule(24)).token_ids
    assert list(first) == list(again) == reference_sampled(llama_model, PROMPT, 24, params)
    assert list(engine.generate(PROMPT, other, StopRule(24)).token_ids) == reference_sampled(llama_model, PROMPT, 24, other)


def test_stop_token_id_ends_the_sequence(engine):
    free = engine.generate(PROMPT, SamplingParams(temperature=1.0, seed=5), StopRule(20)).token_ids
    stop_id = free[6]
    first_hit = free.index(stop_id)
    stopped = engine.generate(PROMPT, SamplingParams(temperature=1.0, seed=5),
                              StopRule(20, stop_ids=frozenset({stop_id})))
    assert stopped.finish_reason == "stop"
    assert stopped.token_ids == free[:first_hit + 1]
    assert stopped.usage.completion_tokens == first_hit + 1


def test_stop_string_truncates_the_text(engine):
    params = SamplingParams(temperature=1.0, seed=11)
    free = engine.generate(PROMPT, params, StopRule(30))
    stop = free.text[10:13]
    cut = engine.generate(PROMPT, params, StopRule(30, stop_strings=(stop,)))
    assert cut.finish_reason == "stop"
    assert cut.text == free.text[:free.text.index(stop)]


def test_concurrent_requests_each_get_their_own_answer(engine):
    prompts = [[5, 17 + i, 42, 99, 3 + i] for i in range(6)]
    solo = [engine.generate(p, GREEDY, StopRule(10)).token_ids for p in prompts]
    results = [None] * len(prompts)

    def ask(i):
        results[i] = engine.generate(prompts[i], GREEDY, StopRule(10)).token_ids

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert results == solo


def test_statistics_count_requests(engine):
    before = engine.stats.snapshot()["num_requests_total"]
    engine.generate(PROMPT, GREEDY, StopRule(4))
    snap = engine.stats.snapshot()
    assert snap["num_requests_total"] == before + 1
    assert snap["avg_spec_accept_length"] == 1.0 and snap["last_gen_throughput"] > 0


class ExplodingDecoder(FakeRunner):
    def __init__(self):
        self.go = threading.Event()

    def start(self, prompt_ids, sampling, max_new_tokens):
        self.go.wait(timeout=10)
        if prompt_ids == [0]:
            raise RuntimeError("boom")
        return [1]

    def step(self):
        return [2]


def test_a_failing_request_does_not_stop_the_worker(llama_tokenizer):
    decoder = ExplodingDecoder()
    decoder.go.set()
    engine = Engine(lambda: decoder, llama_tokenizer).start()
    try:
        failed = engine.generate([0], GREEDY, StopRule(3))
        assert isinstance(failed, Failed) and "boom" in failed.message
        assert engine.generate([5], GREEDY, StopRule(3)).token_ids == (1, 2, 2)
    finally:
        engine.stop()


def test_full_queue_is_refused_and_cancelled_requests_are_skipped(llama_tokenizer):
    decoder = ExplodingDecoder()
    engine = Engine(lambda: decoder, llama_tokenizer, max_queued=1).start()
    events = []
    try:
        engine.submit(GenerationRequest([5], GREEDY, StopRule(2), events.append))      # worker takes it
        while not engine.queue.empty():
            threading.Event().wait(0.01)
        cancelled = GenerationRequest([5], GREEDY, StopRule(2), events.append)
        cancelled.cancelled.set()
        engine.submit(cancelled)                                                         # fills the queue
        with pytest.raises(EngineBusy):
            engine.submit(GenerationRequest([5], GREEDY, StopRule(2), events.append))
        decoder.go.set()
        while not engine.queue.empty():
            threading.Event().wait(0.01)
        assert isinstance(engine.generate([5], GREEDY, StopRule(2)), Finished)
        assert sum(isinstance(e, Finished) for e in events) == 1                         # not the cancelled one
    finally:
        engine.stop()


def test_chunked_prefill_equals_one_pass(llama_model, llama_tokenizer):
    prompt = [(7 * i) % 500 + 3 for i in range(37)]
    outputs = []
    for chunk in (512, 8):      # one pass; 4 chunks of 8, then 5
        engine = Engine(runner_factory(llama_model, 128, prefix_cache=False), llama_tokenizer,
                        chunk_tokens=chunk).start()
        try:
            outputs.append(list(engine.generate(prompt, GREEDY, StopRule(10)).token_ids))
        finally:
            engine.stop()
    assert outputs[0] == outputs[1] == reference_greedy(llama_model, prompt, 10)
