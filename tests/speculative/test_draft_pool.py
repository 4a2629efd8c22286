"""The batch runner's draft K/V: one pool beside the target's, lent by the same reservations.

A crowd of speculative requests that fills the target pool (later ones wait for rows) allocates
no draft K/V of its own: every admitted sequence's draft context is a view of the draft pool
over exactly its target reservation's rows, no KVCache is built while the crowd is served, and
the K/V serving.memory measures (both pools) is the same before and after; so is the prefix
store, preallocated for the drafter's features beside the target's K/V, after a crowd whose
prompts fill it past its capacity.
"""

import re
import subprocess
import sys

import pytest

from serving.engine import Engine, Finished
from serving.engine.batch import BatchRunner
from serving.engine.stops import StopRule
from serving.models.kv_cache import KVCache
from serving.models.tokenizer import Tokenizer
from serving.sampling import SamplingParams
from serving.speculative import METHODS, SpecOptions, build
from tests.crowd import at_once

PROMPT, NEW, CROWD, AT_ONCE = 12, 10, 6, 3   # the pool holds AT_ONCE reservations


def nbytes(cache: KVCache) -> int:
    return sum(t.numel() * t.element_size() for t in (cache.k, cache.v))


@pytest.mark.parametrize("name", [name for name, spec in METHODS.items() if spec.speculative])
def test_a_crowd_filling_the_pool_allocates_no_draft_kv_outside_it(name, tiny_dirs, targets, random_drafts,
                                                                   monkeypatch):
    target = targets["llama"]
    method = build(METHODS[name], target, SpecOptions(draft_path=str(random_drafts["llama"])))
    rows = AT_ONCE * (PROMPT + NEW + method.needs.draft_tokens)
    engine = Engine(lambda: BatchRunner(target, method, capacity=128, max_running=8, max_total_tokens=rows),
                    Tokenizer.from_dir(tiny_dirs["llama"]), chunk_tokens=16).start()
    runner = engine.runner
    before = runner.info().memory
    lent, refused, built = [], [], []
    admit = runner.admit

    def spy(seq):       # what each admission lent (or that it had to wait)
        if not admit(seq):
            refused.append(seq)
            return False
        lent.append((seq.state.cache, seq.state.draft.cache))
        return True

    def build_cache(self, *args, **kwargs):
        built.append(args)
        original(self, *args, **kwargs)

    original = KVCache.__init__
    monkeypatch.setattr(runner, "admit", spy)
    monkeypatch.setattr(KVCache, "__init__", build_cache)
    try:
        prompts = [[3 + (7 * i + j) % 200 for j in range(PROMPT)] for i in range(CROWD)]
        results = at_once([lambda p=p: engine.generate(p, SamplingParams(temperature=0), StopRule(NEW))
                           for p in prompts])
        after = runner.info().memory
    finally:
        engine.stop()
    assert all(isinstance(r, Finished) and len(r.token_ids) == NEW for r in results)
    assert len(lent) == CROWD and refused             # the pool was full: some waited for rows
    assert built == []                                 # no K/V allocated while serving
    pool = runner.spec.pool
    assert pool.capacity == runner.pool.capacity == rows
    for target_rows, draft in lent:                    # the draft's rows are the target's, in the draft pool
        start = target_rows.pool_start
        assert draft.capacity == target_rows.capacity
        assert draft.k.data_ptr() == pool.k[:, :, start].data_ptr()
        assert draft.v.data_ptr() == pool.v[:, :, start].data_ptr()
    assert before == after
    assert after["kv_cache_bytes"] == nbytes(runner.pool) + nbytes(pool)
    store = runner.prefix
    assert store.features.shape == (128 * 8, runner.spec.width)
    assert after["prefix_cache_bytes"] == nbytes(store) + store.features.numel() * store.features.element_size()


def test_the_draft_kv_command_prints_prediction_measurement_and_nothing_outside(tiny_dirs, random_drafts):
    """python -m serving.bench.draft_kv end to end on a tiny pair: the crowd fills the pool and
    its prompts (12 x 12 full blocks) the prefix store past its 128 blocks; the K/V, the prefix
    store and all memory predicted equal what is measured at start and after, and no draft K/V
    lies outside."""
    done = subprocess.run([sys.executable, "-m", "serving.bench.draft_kv", "--model", str(tiny_dirs["llama"]),
                           "--draft", str(random_drafts["llama"]), "--context-length", "256", "--crowd", "12",
                           "--prompt-tokens", "100", "--max-tokens", "8"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    for what in ("K/V", "prefix store", "all memory"):
        figures = re.search(what + r" predicted ([\d,]+) bytes; measured ([\d,]+) at start, ([\d,]+) after",
                            done.stdout)
        assert figures and len(set(figures.groups())) == 1 and figures.group(1) != "0", done.stdout
    assert "(128 of 128 blocks kept)" in done.stdout
    at_once = int(re.search(r"at most (\d+) at once", done.stdout).group(1))
    assert 1 < at_once < 6                                   # batched, and some waited for rows
    assert "draft K/V outside the pools: peak 0 bytes, 0 caches built" in done.stdout
