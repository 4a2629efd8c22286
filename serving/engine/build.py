"""Where the engine gets its decoder: one small function, so a speculative method plugs in here."""

from __future__ import annotations

from serving import speculative


def build_decoder_factory(args, target, tokenizer):
    """A zero-argument callable returning the Decoder the engine worker will use.

    Routed through serving.speculative.METHODS: the method is built (and its draft preflighted
    against the target) here, so a mismatch stops start-up with one line naming both sides.
    """
    options = speculative.SpecOptions(draft_path=args.speculative_draft_model_path,
                               block_size=args.speculative_num_draft_tokens,
                               budget=args.speculative_ddtree_budget)
    return speculative.decoder_factory(speculative.resolve(args.speculative_algorithm), target, options,
                                capacity=args.context_length, seed=args.random_seed)
