"""The one table of speculative methods (METHODS) and what each needs; the only place a
method's name appears, on either side.

A method is a drafter plus a verifier. What a method needs (a draft model, a hidden-state
capture on the target, a tree budget) is derived from those two parts, so a new method that
reuses the DFlash drafter inherits the capture by construction. ddops renders, gates and
preflights from these capabilities; the runtime maps each part to its builder
(serving/speculative/__init__.py) and derives its runner needs from the built parts.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Drafter:
    """Where draft tokens come from."""

    needs_draft_model: bool
    # The target must return the residual stream after the draft's `target_layer_ids`
    # (concatenated: [T, K * hidden]) so the drafter can condition on them.
    captures_target_hidden: bool


@dataclass(frozen=True)
class Verifier:
    """How the target checks a draft."""

    tree: bool  # verifies a token tree (needs a node budget and tree attention), not a chain


@dataclass(frozen=True)
class Method:
    sglang_name: str | None  # spelling for --speculative-algorithm; None = flag not passed
    drafter: Drafter | None
    verifier: Verifier | None
    # vLLM's `method` in --speculative-config; None: plain decoding, or a method vLLM cannot
    # serve (it has no tree verifier: DDTree is not in vLLM 0.32's SpeculativeMethod).
    vllm_name: str | None = None

    @property
    def is_speculative(self) -> bool:
        return self.drafter is not None

    @property
    def needs_draft(self) -> bool:
        return self.drafter is not None and self.drafter.needs_draft_model

    @property
    def needs_target_hidden_capture(self) -> bool:
        return self.drafter is not None and self.drafter.captures_target_hidden

    @property
    def uses_tree_budget(self) -> bool:
        return self.verifier is not None and self.verifier.tree

    @property
    def uses_block_size(self) -> bool:
        return self.is_speculative

    def tree_budget(self, block: int, budget: int | None = None) -> int | None:
        """Nodes a tree verifier verifies after its root: `budget`, else block - 1; None for a chain."""
        if not self.uses_tree_budget:
            return None
        return budget if budget is not None else block - 1

    def verify_rows(self, block: int, budget: int | None = None) -> int:
        """Most rows one verify pass adds to the target's K/V (the rows preallocated past the
        context): 0 plain; the draft block (bonus + block - 1 drafts) for a chain; for a tree its
        root plus the budget, and never fewer than the block the drafter writes."""
        if not self.is_speculative:
            return 0
        if self.uses_tree_budget:
            return max(block, self.tree_budget(block, budget) + 1)
        return block


DFLASH_DRAFTER = Drafter(needs_draft_model=True, captures_target_hidden=True)
CHAIN = Verifier(tree=False)
TREE = Verifier(tree=True)

METHODS: dict[str, Method] = {
    "none": Method(sglang_name=None, drafter=None, verifier=None),
    "dflash": Method(sglang_name="DFLASH", drafter=DFLASH_DRAFTER, verifier=CHAIN, vllm_name="dflash"),
    # DDTree reuses the DFlash drafter; only the verifier differs.
    "ddtree": Method(sglang_name="DDTREE", drafter=DFLASH_DRAFTER, verifier=TREE),
}


def method_key(algorithm: str) -> str:
    """Normalise a spelling (`ddtree`, `DDTREE`, `DDTree`) to its METHODS key, or raise KeyError."""
    key = algorithm.strip().lower()
    if key not in METHODS:
        raise KeyError(algorithm)
    return key


def method_for(algorithm: str) -> Method:
    return METHODS[method_key(algorithm)]


def reported_algorithm(value) -> str | None:
    """A server's /server_info `speculative_algorithm` in SGLang's spelling; None for plain decoding
    (absent, empty, or a method that has no SGLang name). Unknown spellings pass through upper-cased."""
    if value is None or not str(value).strip():
        return None
    key = str(value).strip().lower()
    return METHODS[key].sglang_name if key in METHODS else str(value).strip().upper()
