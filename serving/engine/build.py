"""Where the engine gets its runner: one small function, so a speculative method plugs in here."""

from __future__ import annotations

from functools import partial

import torch

from serving import speculative
from serving.engine.batch import BatchRunner
from serving.engine.engine import Engine
from serving.models import inspect_checkpoint, load_model
from serving.models.tokenizer import Tokenizer


def build_runner_factory(args, target, tokenizer=None):
    """A zero-argument callable returning the engine's runner for the server's resolved `args`.

    Routed through serving.speculative.METHODS: the method is built (and its draft preflighted
    against the target) here, so a mismatch stops start-up with one line naming both sides.
    Every target and method runs in the batch runner; what a target cannot batch (a hybrid's
    verify forward) is the runner's own slot rule, not another runner.
    """
    spec = speculative.resolve(args.speculative_algorithm)
    options = speculative.SpecOptions(draft_path=args.speculative_draft_model_path,
                                      block_size=args.speculative_num_draft_tokens,
                                      budget=args.speculative_ddtree_budget,
                                      adaptive=args.speculative_adaptive == "on")
    return runner_factory(target, args.context_length, spec, options, seed=args.random_seed,
                          max_running=args.max_running_requests, max_total_tokens=args.max_total_tokens,
                          prefix_cache=not args.disable_radix_cache)


def runner_factory(target, capacity: int, spec=None, options=None, seed: int = 0, max_running: int | None = None,
                   max_total_tokens: int | None = None, prefix_cache: bool = True):
    """The same for a method spec (None: plain decoding) and its options (tests and benchmarks);
    builds the method now."""
    spec, options = spec or speculative.resolve(None), options or speculative.SpecOptions()
    return partial(BatchRunner, target, speculative.build(spec, target, options), capacity=capacity,
                   max_running=max_running, max_total_tokens=max_total_tokens, seed=seed,
                   adaptive=options.adaptive, prefix_cache=prefix_cache)


def load_engine(args):
    """The server's engine for its resolved `args`, started: the checkpoint loaded and the runner
    built (in the engine process, serving.engine.process). Its queue has no bound of its own
    (max_queued 0): the process's parent keeps it."""
    tokenizer = Tokenizer.from_dir(args.model_path)
    model = load_model(inspect_checkpoint(args.model_path), getattr(torch, args.dtype), args.device, args.context_length)
    return Engine(build_runner_factory(args, model, tokenizer), tokenizer, max_queued=0,
                  chunk_tokens=args.chunked_prefill_size or 512).start()
