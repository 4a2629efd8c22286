"""Greedy speculative output equals plain greedy output, token for token, through the real engine
(its batch runner, one request at a time).

Llama and Qwen3 tiny fp32 targets, and the Llama one in bf16 (packed bf16 products, fp32
between them: serving.contract.runtime.compute_dtype), with distilled DFlash drafts (so rounds
really accept several tokens), many prompts and lengths, stop strings, stop ids (EOS) and
max_tokens boundaries that fall inside a round.
"""

import pytest
import torch

from serving.engine import Engine
from serving.engine.stops import StopRule
from serving.models.tokenizer import Tokenizer
from serving.sampling import SamplingParams
from serving.engine.build import runner_factory
from serving.kernels import linear_bf16
from serving.models import cpu_gemm, inspect_checkpoint, load_model
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


def plain(arch, target, tiny_dirs):
    tokenizer = Tokenizer.from_dir(tiny_dirs[arch])
    engine = engine_for("none", target, tokenizer, None)
    runs = [(prompt, rule, engine.generate(prompt, GREEDY, rule)) for prompt, rule in cases(engine, tokenizer)]
    engine.stop()
    return arch, target, tokenizer, runs


@pytest.fixture(scope="module", params=["llama", "qwen3"])
def plain_runs(request, tiny_dirs, targets):
    return plain(request.param, targets[request.param], tiny_dirs)


@pytest.fixture(scope="module")
def plain_runs_bf16(tiny_dirs):
    return plain("llama", load_model(inspect_checkpoint(tiny_dirs["llama"]), torch.bfloat16, "cpu", 1024), tiny_dirs)


@pytest.mark.parametrize("name, block, budget, adaptive", SETTINGS)
def test_greedy_speculative_equals_plain(plain_runs, distilled_drafts, name, block, budget, adaptive):
    equal_to_plain(plain_runs, distilled_drafts, name, block, budget, adaptive)


@pytest.mark.parametrize("name, block, budget, adaptive", [SETTINGS[0], SETTINGS[4], SETTINGS[6]])
def test_greedy_speculative_equals_plain_in_bf16(plain_runs_bf16, distilled_drafts, name, block, budget, adaptive):
    """bf16 weights: every pass's products round the same rows the same way, and the attention
    between them runs in fp32, so a verify tree's tokens are plain decoding's. The drafter's
    projections run through the same bf16 products (contract.runtime.draft_projection_dtype)."""
    assert plain_runs_bf16[1].weight_dtype == torch.bfloat16
    engine = equal_to_plain(plain_runs_bf16, distilled_drafts, name, block, budget, adaptive)
    draft = engine.runner.spec.drafter.model
    projections = [m for m in draft.modules() if isinstance(m, cpu_gemm.Linear)]
    assert draft.dtype == torch.float32 and len(projections) == 1 + 7 * draft.cfg.num_layers
    assert all(m.packed and linear_bf16.is_blocked(m.weight) for m in projections)


def equal_to_plain(plain_runs, distilled_drafts, name, block, budget, adaptive):
    """The engine's greedy answers equal plain decoding's; returns the stopped engine."""
    arch, target, tokenizer, runs = plain_runs
    engine = engine_for(name, target, tokenizer, distilled_drafts[arch], block, budget, adaptive)
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
    return engine
