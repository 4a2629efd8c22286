"""Where the engine gets its decoder: one small function, so a speculative method plugs in here."""

from __future__ import annotations

from functools import partial

from serving.engine.decoder import ARDecoder


def build_decoder_factory(args, target, tokenizer):
    """A zero-argument callable returning the Decoder the engine worker will use."""
    return partial(ARDecoder, target, capacity=args.context_length, seed=args.random_seed)
