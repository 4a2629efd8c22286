"""The truth both sides share, stdlib only: what each speculative method needs, the rules
a draft must meet to run on a target, the state slots the bundled runtime preallocates
(`runtime.py`) and the parameter and cache bytes of its models (`sizes.py`).

`ddops` imports this package and nothing else of `serving` (tests/test_boundaries.py), so the
capabilities it renders (methods.py, and drafts.py for draft architectures) and gates on and the pairing rules it checks before touching a host are
the ones the runtime enforces at start-up.
"""

from .methods import (CHAIN, DFLASH_DRAFTER, METHODS, TREE, Drafter, Method, Verifier, method_for, method_key,
                      reported_algorithm)
from .drafts import DRAFTS, DraftArch, architecture, draft_arch, draft_value, output_scale
from .pairing import Problem, derived_layer_ids, mask_token_id, problems, target_layer_ids, text_config

__all__ = ["CHAIN", "DFLASH_DRAFTER", "DRAFTS", "DraftArch", "architecture", "draft_arch", "draft_value",
           "output_scale", "METHODS", "TREE", "Drafter", "Method", "Problem", "Verifier",
           "derived_layer_ids", "mask_token_id", "method_for", "method_key", "problems", "reported_algorithm",
           "target_layer_ids", "text_config"]
