"""What a speculative method is made of: a drafter, a verifier, and what they need.

Pure data, no torch: the runner reads `Method.needs` (never a method's name) to decide
which target layers to capture, whether the verify pass takes a tree mask, and how many
rows a verify pass may add to the KV cache.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

from serving import contract


class PreflightError(ValueError):
    """A draft/target mismatch; str() is one line naming both sides."""


@dataclass(frozen=True)
class Needs:
    """What a part asks of the target runner.

    target_layers: decoder-layer ids whose outputs the target returns, in this order.
    tree_attention: the verify pass carries a [T, T] visibility mask (not plain causal).
    draft_tokens: most rows one verify pass adds to the target KV cache.
    """

    target_layers: tuple[int, ...] = ()
    tree_attention: bool = False
    draft_tokens: int = 0

    def __or__(self, other: Needs) -> Needs:
        # Order matters for target_layers: the drafter's fc reads them in config order.
        layers = self.target_layers + tuple(k for k in other.target_layers if k not in self.target_layers)
        return Needs(
            target_layers=layers,
            tree_attention=self.tree_attention or other.tree_attention,
            draft_tokens=max(self.draft_tokens, other.draft_tokens),
        )


class Drafter(Protocol):
    """Proposes per-depth token distributions for the positions after each sequence's bonus
    token, for every drafting sequence in one pass (serving.speculative.dflash.DFlashDrafter)."""

    needs: Needs
    feature_width: int
    vocab: Any  # [V'] long token ids the draft logits' columns stand for; None = the whole vocabulary

    def pool(self, rows: int) -> Any:
        """The draft's K/V pool of `rows` rows, allocated once at start."""

    def context(self, pool: Any, start: int, rows: int) -> Any:
        """A new sequence's draft context over pool rows [start, start + rows)."""

    def extend(self, context: Any, features: Any) -> None:
        """Queue target features [n, feature_width] of the sequence's next n committed tokens."""

    def absorb(self, contexts: list) -> None:
        """Project every queued feature of these contexts (plain rounds call it now and then)."""

    def propose(self, contexts: list, bonuses: list[int], depths: list[int]) -> list:
        """Draft logits [depth_b, V'] per sequence for the positions after its bonus (columns: `vocab`)."""


class Verifier(Protocol):
    """Turns draft logits into a tree of candidate tokens rooted at the bonus token."""

    needs: Needs
    budget: int | None  # tree nodes below the root per verify pass; None for a chain

    def plan(self, bonus: int, draft_logits: Any, budget_rows: int, vocab: Any = None) -> Any:
        """A `serving.speculative.tree.Tree` with at most budget_rows rows (root included);
        vocab maps draft-logit columns to token ids (None: column = token id)."""


@dataclass(frozen=True)
class Method:
    """A built method: drafter + verifier; its needs are the union of theirs."""

    name: str
    drafter: Drafter
    verifier: Verifier

    @property
    def needs(self) -> Needs:
        return self.drafter.needs | self.verifier.needs


@dataclass(frozen=True)
class SpecOptions:
    """Resolved speculative flags (see docs/contracts.md section 1)."""

    draft_path: str | None = None
    block_size: int | None = None  # None: the draft config's block_size
    budget: int | None = None  # None: block_size - 1 (tree verifiers only)
    adaptive: bool = False  # per round: plain or a verify width up to the above (serving.speculative.adaptive)
    draft_vocab: bool = True  # use the draft's draft_vocab.json (reduced proposal vocabulary) when present


DrafterFactory = Callable[[Any, SpecOptions], Drafter]
VerifierFactory = Callable[[SpecOptions, dict], Verifier]


@dataclass(frozen=True)
class MethodSpec:
    """One row of METHODS: how to build a method, and what it accepts."""

    name: str
    drafter: DrafterFactory | None = None
    verifier: VerifierFactory | None = None
    takes_budget: bool = False
    aliases: tuple[str, ...] = field(default=())
    caps: contract.Method | None = None  # its METHODS row in serving.contract (None: plain)

    def verify_rows(self, block: int, budget: int | None = None) -> int:
        """Rows a verify pass may add to the target's K/V, by the contract's one rule; the
        built method's `needs.draft_tokens` is this figure (tests/speculative/test_methods.py)."""
        return self.caps.verify_rows(block, budget) if self.caps else 0

    @property
    def speculative(self) -> bool:
        return self.drafter is not None

    @property
    def server_name(self) -> str | None:
        """The spelling SGLang reports in /server_info (None for plain decoding)."""
        return self.name.upper() if self.speculative else None
