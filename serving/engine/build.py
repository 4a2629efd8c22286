"""Where the engine gets its decoder: one small function, so a speculative method plugs in here."""

from __future__ import annotations

from functools import partial

from serving import speculative
from serving.contract.runtime import one_at_a_time
from serving.models import batched


def build_decoder_factory(args, target, tokenizer):
    """A zero-argument callable returning what the engine worker decodes with.

    Routed through serving.speculative.METHODS: the method is built (and its draft preflighted
    against the target) here, so a mismatch stops start-up with one line naming both sides.
    A target with a batched decode step gets the batch runner (many sequences in flight),
    unless serving.contract.runtime.one_at_a_time says otherwise (a speculative hybrid); any
    other gets the method's one-sequence Decoder.
    """
    spec = speculative.resolve(args.speculative_algorithm)
    options = speculative.SpecOptions(draft_path=args.speculative_draft_model_path,
                                      block_size=args.speculative_num_draft_tokens,
                                      budget=args.speculative_ddtree_budget,
                                      adaptive=args.speculative_adaptive == "on")
    if not batched.decodes(target) or one_at_a_time(target.config.hybrid, spec.speculative):
        return speculative.decoder_factory(spec, target, options, capacity=args.context_length,
                                           seed=args.random_seed)   # options carry `adaptive`
    from serving.engine.batch import BatchRunner

    return partial(BatchRunner, target, speculative.build(spec, target, options), capacity=args.context_length,
                   max_running=args.max_running_requests, max_total_tokens=args.max_total_tokens,
                   seed=args.random_seed, adaptive=options.adaptive, prefix_cache=not args.disable_radix_cache)
