"""How the batch runner serves a hybrid: plain decoding with a HybridPool holding a state slot
per running sequence; a speculative method under its slot rule, one sequence at a time, since
its verify forward has no packed form for the recurrent state
(serving.contract.runtime.one_at_a_time); and serving.memory predicts what each allocates."""

from types import SimpleNamespace

import pytest
import torch

from serving import memory
from serving.engine import Engine, Finished, StopRule
from serving.engine.batch import BatchRunner
from serving.engine.build import build_runner_factory
from serving.engine.hybrid_pool import HybridPool
from serving.models import batched, inspect_checkpoint, load_model
from serving.sampling import SamplingParams
from serving.tools.tiny import write_tiny
from serving.tools.tiny_draft import write_tiny_draft


class Ids:
    def decode(self, ids):
        return " ".join(map(str, ids))


def server_args(**overrides):
    args = dict(speculative_algorithm=None, speculative_draft_model_path=None,
                speculative_num_draft_tokens=None, speculative_ddtree_budget=None,
                speculative_adaptive="on", context_length=128, random_seed=0,
                max_running_requests=4, max_total_tokens=None, disable_radix_cache=False, device="cpu")
    return SimpleNamespace(**{**args, **overrides})


def test_a_plain_hybrid_is_served_by_the_batch_runner_with_a_state_slot_per_sequence(hf_pairs):
    model = hf_pairs["lllf-lllf"][1]
    assert not batched.supports(model) and batched.decodes(model)
    engine = Engine(build_runner_factory(server_args(), model, None), Ids()).start()
    try:
        runner = engine.scheduler.runner
        assert isinstance(runner, BatchRunner) and isinstance(runner.pool, HybridPool)
        assert runner.pool.conv.shape[0] == 4 and runner.pool.capacity == 128
        result = engine.generate([5, 6, 7], SamplingParams(temperature=0), StopRule(4))
        assert isinstance(result, Finished) and len(result.token_ids) == 4
    finally:
        engine.stop()


def test_a_speculative_hybrid_runs_in_the_batch_runner_one_sequence_at_a_time(tmp_path):
    target = write_tiny(tmp_path / "hybrid", "qwen3_5")
    draft = write_tiny_draft(target, tmp_path / "draft", seed=1)
    model = load_model(inspect_checkpoint(target), torch.float32, "cpu", 256)
    args = server_args(speculative_algorithm="ddtree", speculative_draft_model_path=str(draft),
                       speculative_ddtree_budget=4)
    engine = Engine(build_runner_factory(args, model, None), Ids()).start()
    try:
        runner = engine.scheduler.runner
        assert isinstance(runner, BatchRunner) and runner.max_running == 1 and runner.pool.conv.shape[0] == 1
        result = engine.generate([5, 6, 7], SamplingParams(temperature=0), StopRule(4))
        assert isinstance(result, Finished) and len(result.token_ids) == 4
    finally:
        engine.stop()


@pytest.fixture(scope="module")
def tiny_pairs(tmp_path_factory):
    """arch -> (target dir, random draft dir, loaded target)."""
    pairs = {}
    for arch in ("qwen3_5", "llama"):
        root = tmp_path_factory.mktemp(arch)
        target = write_tiny(root / "target", arch)
        draft = write_tiny_draft(target, root / "draft", seed=1)
        pairs[arch] = (target, draft, load_model(inspect_checkpoint(target), torch.float32, "cpu", 256))
    return pairs


# The runtime refuses --max-total-tokens on a speculative hybrid (tests/serving/test_cli.py).
MEMORY_CASES = [(arch, extra, algorithm) for algorithm in (None, "dflash", "ddtree")
                for arch, extra in [("qwen3_5", {}), ("qwen3_5", dict(max_total_tokens=300)), ("llama", {}),
                                    ("llama", dict(max_total_tokens=300)), ("llama", dict(disable_radix_cache=True))]
                if not (arch == "qwen3_5" and algorithm and extra)]


@pytest.mark.parametrize("arch, extra, algorithm", MEMORY_CASES)
def test_the_memory_prediction_is_what_each_runner_allocates(tiny_pairs, arch, algorithm, extra):
    """Weights, state slots, the whole K/V (target and draft) and the prefix store, predicted
    from config.json (serving.memory) for the runner the routing picks, at start and after a
    request that fills most of the context and a crowd of prompts that fills the prefix cache
    past its capacity: the batch runner's pool of --max-total-tokens rows, a draft pool of as
    many rows with a speculative method, 3 slots and, for a dense target, the prefix store
    (128 blocks x 8 rows of K/V, + the drafter's features; none with --disable-radix-cache);
    or, for a speculative hybrid, one sequence's cache of context + verify rows, the draft's
    context K/V for the same rows, and one slot."""
    target, draft, model = tiny_pairs[arch]
    args = server_args(model_path=str(target), dtype="float32", speculative_algorithm=algorithm,
                       speculative_draft_model_path=str(draft) if algorithm else None, max_running_requests=3,
                       speculative_adaptive="off", **extra)
    engine = Engine(build_runner_factory(args, model, None), Ids()).start()
    try:
        runner = engine.scheduler.runner
        first = memory.report(runner.info().memory, args)
        result = engine.generate(list(range(5, 105)), SamplingParams(temperature=0), StopRule(20))
        assert isinstance(result, Finished)
        prefix = runner.prefix
        if prefix is not None:      # 12 prompts of 12 full blocks each: 144 blocks > 128 kept
            for j in range(12):
                assert isinstance(engine.generate([200 + j, *range(5, 101)], SamplingParams(temperature=0),
                                                  StopRule(1)), Finished)
            assert len(prefix.blocks) == prefix.max_blocks == 128 and not prefix.free
        assert memory.report(runner.info().memory, args) == first      # nothing grows past what start-up reserved
    finally:
        engine.stop()
    assert first["predicted_weights_bytes"] == first["weights_bytes"]
    assert first["predicted_state_cache_bytes"] == first["state_cache_bytes"]
    assert first["predicted_kv_cache_bytes"] == first["kv_cache_bytes"]
    assert first["predicted_prefix_cache_bytes"] == first["prefix_cache_bytes"]
    assert first["predicted_bytes"] == first["measured_bytes"]
    stores = arch == "llama" and not extra.get("disable_radix_cache")
    assert (prefix is not None) == stores
    features = runner.spec.width if stores and algorithm else 0      # kept with each row of K/V
    row = model.new_cache(1).k[:, :, :1].numel() * 2 * 4 if stores else 0
    assert first["prefix_cache_bytes"] == 128 * 8 * (row + features * 4)
    one_slot = model.new_cache(1).state_bytes() if arch == "qwen3_5" else 0
    alone = arch == "qwen3_5" and algorithm is not None      # the slot rule: one sequence at a time
    assert runner.max_running == (1 if alone else 3)
    assert first["state_cache_bytes"] == (1 if alone else 3) * one_slot
    assert runner.pool.capacity == extra.get("max_total_tokens", 128 + runner.verify_rows)
    if algorithm:       # the draft pool beside the target's: as many rows over the draft's layers
        assert runner.spec.pool.capacity == runner.pool.capacity
    else:
        assert runner.spec is None
