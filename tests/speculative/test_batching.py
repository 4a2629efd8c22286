"""Every method in METHODS under continuous batching: answers in a crowd equal the answers alone.

The batch runner speculates when exactly one sequence decodes and takes batched plain steps
when several do (serving.engine.batch); the drafter then catches up from the kept features.
Alone, a request runs speculative rounds; in a crowd of 16 it mostly runs plain steps and
speculates again once its neighbours finish, so both paths and the switches between them
meet in one comparison: greedy requests, and seeded sampled ones (their draws are keyed by
position, serving.sampling.PositionalDraws). Tiny fp32 targets with distilled drafts.
"""

import threading

import pytest
import torch

from serving.engine import Engine
from serving.engine.batch import BatchRunner
from serving.engine.stops import StopRule
from serving.models.tokenizer import Tokenizer
from serving.sampling import SamplingParams
from serving.speculative import METHODS, SpecOptions, build

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


def engine_for(target, tokenizer, name, draft, block, budget) -> Engine:
    method = build(METHODS[name], target, SpecOptions(draft_path=str(draft), block_size=block, budget=budget))
    return Engine(lambda: BatchRunner(target, method, capacity=512, max_running=16), tokenizer,
                  chunk_tokens=16).start()


@pytest.mark.parametrize("name, block, budget", SETTINGS)
@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_answers_in_a_crowd_equal_answers_alone(arch, name, block, budget, tiny_dirs, targets,
                                                       distilled_drafts):
    tokenizer = Tokenizer.from_dir(tiny_dirs[arch])
    engine = engine_for(targets[arch], tokenizer, name, distilled_drafts[arch], block, budget)
    try:
        cases = requests(tokenizer, eos=tokenizer.eos_ids and min(tokenizer.eos_ids) or 0)
        alone = [engine.generate(*case) for case in cases]
        together = [None] * len(cases)
        threads = [threading.Thread(target=lambda i=i: together.__setitem__(i, engine.generate(*cases[i])))
                   for i in range(len(cases))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        assert [(r.token_ids, r.finish_reason) for r in together] == \
            [(r.token_ids, r.finish_reason) for r in alone]
        if METHODS[name].speculative:   # alone, rounds really committed several tokens
            assert max(r.usage.accept_length for r in alone) > 1.0
    finally:
        engine.stop()
