"""Greedy speculative output equals plain greedy output, token for token, through the real engine
(its batch runner, one request at a time).

Llama and Qwen3 tiny fp32 targets with distilled DFlash drafts (so rounds really accept
several tokens), many prompts and lengths, stop strings, stop ids (EOS) and max_tokens
boundaries that fall inside a round.
"""

import pytest
import torch

from serving.engine import Engine
from serving.engine.stops import StopRule
from serving.models.tokenizer import Tokenizer
from serving.sampling import SamplingParams
from serving.engine.build import runner_factory
from serving.speculative import METHODS, SpecOptions

TEXTS = ["The capital of France is", "def fibonacci(n):", "Servers listen on a port,", "A"]
GREEDY = SamplingParams(temperature=0)
# (method, block size, budget, adaptive): defaults, a short block, a tiny tree, a wide tree,
# and the adaptive controller mixing plain rounds with every width up to the given one
SETTINGS = [("dflash", None, None, False), ("dflash", 4, None, False), ("ddtree", None, None, False),
            ("ddtree", None, 3, False), ("ddtree", None, 48, False), ("dflash", None, None, True),
            ("ddtree", None, 48, True)]


def prompts(tokenizer) -> list[list[int]]:
    gen = torch.Generator().manual_seed(7)
    encoded = [tokenizer.encode(t, prompt=False) for t in TEXTS]
    random_ids = [torch.randint(3, tokenizer.vocab_size, (n,), generator=gen).tolist() for n in (1, 2, 9, 40)]
    return encoded + random_ids


def engine_for(spec_name, target, tokenizer, draft, block=None, budget=None, adaptive=False) -> Engine:
    options = SpecOptions(draft_path=str(draft), block_size=block, budget=budget, adaptive=adaptive)
    return Engine(runner_factory(target, 512, METHODS[spec_name], options), tokenizer).start()


def cases(plain: Engine, tokenizer):
    """(prompt, rule) pairs; stop strings and stop ids are taken from the plain output itself."""
    out = []
    for prompt in prompts(tokenizer):
        for n in (1, 2, 7, 8, 9, 21):
            out.append((prompt, StopRule(max_new_tokens=n)))
        full = plain.generate(prompt, GREEDY, StopRule(max_new_tokens=40))
        middle = len(full.text) // 2
        if full.text[middle:middle + 3].strip():
            out.append((prompt, StopRule(max_new_tokens=40, stop_strings=(full.text[middle:middle + 3],))))
        out.append((prompt, StopRule(max_new_tokens=40, stop_ids=frozenset({full.token_ids[11]}))))
    return out


@pytest.fixture(scope="module", params=["llama", "qwen3"])
def plain_runs(request, tiny_dirs, targets):
    arch = request.param
    tokenizer = Tokenizer.from_dir(tiny_dirs[arch])
    plain = engine_for("none", targets[arch], tokenizer, None)
    runs = [(prompt, rule, plain.generate(prompt, GREEDY, rule)) for prompt, rule in cases(plain, tokenizer)]
    plain.stop()
    return arch, tokenizer, runs


@pytest.mark.parametrize("name, block, budget, adaptive", SETTINGS)
def test_greedy_speculative_equals_plain(plain_runs, targets, distilled_drafts, name, block, budget, adaptive):
    arch, tokenizer, runs = plain_runs
    engine = engine_for(name, targets[arch], tokenizer, distilled_drafts[arch], block, budget, adaptive)
    if adaptive:  # explore every round: settings switch all the time (on these tiny targets plain wins)
        controller = engine.runner.spec.controller(1)     # one request at a time: batch size 1
        controller.churn = True
    reasons = set()
    try:
        for prompt, rule, expected in runs:
            got = engine.generate(prompt, GREEDY, rule)
            assert (got.token_ids, got.text, got.finish_reason) == \
                (expected.token_ids, expected.text, expected.finish_reason), (prompt, rule)
            reasons.add(got.finish_reason)
        # some rounds really committed several tokens, so boundaries fell inside rounds (as run:
        # what the draft accepts is a sample, and churn's rounds are no window's)
        assert engine.stats.snapshot()["avg_tokens_per_round"] > 1.0
    finally:
        engine.stop()
    assert reasons == {"stop", "length"}
