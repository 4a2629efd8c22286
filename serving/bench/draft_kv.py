"""The batch runner's draft K/V and prefix store under a crowd: predicted, measured, and any
draft K/V allocated outside its pools.

    python -m serving.bench.draft_kv --model $DDOPS_CACHE/models/smollm2-135m-instruct
        --draft $DDOPS_CACHE/models/smollm2-135m-instruct-dflash [--method dflash]
        [--context-length 2048] [--crowd 8] [--prompt-tokens 256] [--max-tokens 32]

Starts the runner the server would route to (float32 on CPU), then serves `--crowd` greedy
requests at once, enough to fill the target pool so that some wait for rows. Printed:
serving.memory's predicted and measured K/V bytes, prefix store bytes (with how many of its
blocks the crowd's prompts filled) and total bytes at start and after the crowd, and the draft
K/V that admitted sequences held outside the runner's pools: at its peak, and how many such
caches were built (none when each draft context is a range of the draft pool). Random prompts
share no prefix, so a crowd of more than 128 full 8-token blocks fills the prefix store past
its capacity (its least recent blocks' slots are reused).
"""

from __future__ import annotations

import argparse
import threading

import torch

from serving import memory
from serving.config import ServerArgs, parse_args, resolve
from serving.engine import Engine
from serving.engine.build import build_runner_factory
from serving.engine.stops import StopRule
from serving.models import inspect_checkpoint, load_model
from serving.models.tokenizer import Tokenizer
from serving.sampling import SamplingParams


def server_args(opts, model_config) -> ServerArgs:
    """The server's own arguments for this run (its parser and checkpoint defaults), float32 on CPU."""
    argv = ["--model-path", opts.model, "--dtype", "float32", "--context-length", str(opts.context_length),
            "--speculative-algorithm", opts.method, "--speculative-draft-model-path", opts.draft,
            "--speculative-adaptive", "off"]
    return resolve(parse_args(argv, environ={}), model_config, cuda_available=False)


def outside_bytes(runner, seq) -> int:
    """Bytes of the sequence's draft K/V that are not a range of the runner's draft pool."""
    cache, pool = seq.state.draft.cache, runner.spec.pool
    if cache.k.untyped_storage().data_ptr() == pool.k.untyped_storage().data_ptr():
        return 0
    return sum(t.numel() * t.element_size() for t in (cache.k, cache.v))


def watch(runner) -> dict:
    """Wrap admit/release to follow draft K/V held outside the pools (live, peak, caches)."""
    seen = {"live": 0, "peak": 0, "caches": 0, "at_once": 0, "running": 0}
    admit, release, held_by = runner.admit, runner.release, {}

    def admitted(seq):
        if not admit(seq):
            return False
        held = outside_bytes(runner, seq)
        held_by[id(seq)] = held
        seen["caches"] += held > 0
        seen["running"] += 1
        seen["live"] += held
        seen["peak"], seen["at_once"] = max(seen["peak"], seen["live"]), max(seen["at_once"], seen["running"])
        return True

    def released(seq):
        seen["live"] -= held_by.pop(id(seq), 0)
        seen["running"] -= 1
        release(seq)

    runner.admit, runner.release = admitted, released
    return seen


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--draft", required=True)
    parser.add_argument("--method", default="dflash")
    parser.add_argument("--context-length", type=int, default=2048)
    parser.add_argument("--crowd", type=int, default=8)
    parser.add_argument("--prompt-tokens", type=int, default=256)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--threads", type=int, default=1)
    opts = parser.parse_args()
    torch.set_num_threads(opts.threads)
    checkpoint = inspect_checkpoint(opts.model)
    args = server_args(opts, checkpoint.config)
    target = load_model(checkpoint, torch.float32, "cpu", opts.context_length)
    tokenizer = Tokenizer.from_dir(opts.model)
    engine = Engine(build_runner_factory(args, target, tokenizer), tokenizer).start()
    try:
        runner = engine.runner
        start = memory.report(runner.info().memory, args)
        seen = watch(runner)
        gen = torch.Generator().manual_seed(0)
        prompts = [torch.randint(3, tokenizer.vocab_size, (opts.prompt_tokens,), generator=gen).tolist()
                   for _ in range(opts.crowd)]
        threads = [threading.Thread(target=engine.generate, args=(p, SamplingParams(temperature=0),
                                                                  StopRule(opts.max_tokens))) for p in prompts]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        after = memory.report(runner.info().memory, args)
    finally:
        engine.stop()
    print(f"target pool {runner.pool.capacity:,} rows; {opts.crowd} requests of "
          f"{opts.prompt_tokens} + {opts.max_tokens} tokens, at most {seen['at_once']} at once")
    print(f"K/V predicted {start['predicted_kv_cache_bytes']:,} bytes; measured {start['kv_cache_bytes']:,} "
          f"at start, {after['kv_cache_bytes']:,} after the crowd")
    prefix = runner.prefix
    print(f"prefix store predicted {start['predicted_prefix_cache_bytes']:,} bytes; measured "
          f"{start['prefix_cache_bytes']:,} at start, {after['prefix_cache_bytes']:,} after the crowd "
          f"({len(prefix.blocks)} of {prefix.max_blocks} blocks kept)")
    print(f"all memory predicted {start['predicted_bytes']:,} bytes; measured {start['measured_bytes']:,} "
          f"at start, {after['measured_bytes']:,} after the crowd")
    print(f"draft K/V outside the pools: peak {seen['peak']:,} bytes, {seen['caches']} caches built")


if __name__ == "__main__":
    main()
