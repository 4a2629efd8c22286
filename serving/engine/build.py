"""Where the engine gets its decoder: one small function, so a speculative method plugs in here."""

from __future__ import annotations

from functools import partial

from serving import speculative
from serving.models import batched


def build_decoder_factory(args, target, tokenizer):
    """A zero-argument callable returning what the engine worker decodes with.

    Routed through serving.speculative.METHODS: the method is built (and its draft preflighted
    against the target) here, so a mismatch stops start-up with one line naming both sides.
    A target the batched forward supports, with a method whose drafter has a batched form (or
    no method), gets the batch runner (many sequences in flight), and so does a target with
    only a batched decode step (hybrids) decoding plainly; any other gets the method's
    one-sequence Decoder.
    """
    spec = speculative.resolve(args.speculative_algorithm)
    options = speculative.SpecOptions(draft_path=args.speculative_draft_model_path,
                                      block_size=args.speculative_num_draft_tokens,
                                      budget=args.speculative_ddtree_budget,
                                      adaptive=args.speculative_adaptive == "on")
    if not batched.supports(target) and (spec.speculative or not batched.decodes(target)):
        return speculative.decoder_factory(spec, target, options, capacity=args.context_length,
                                           seed=args.random_seed)   # options carry `adaptive`
    from serving.engine.batch import BatchRunner
    from serving.speculative.decoder import SpecDecoder
    from serving.speculative.lane import SpecLane

    method = speculative.build(spec, target, options)
    if method is not None and not SpecLane.batchable(method):
        return partial(SpecDecoder, target, method, capacity=args.context_length, seed=args.random_seed,
                       adaptive=options.adaptive)
    return partial(BatchRunner, target, method, capacity=args.context_length,
                   max_running=args.max_running_requests, max_total_tokens=args.max_total_tokens,
                   seed=args.random_seed, adaptive=options.adaptive)
