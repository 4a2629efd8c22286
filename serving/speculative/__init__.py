"""Speculative decoding methods, built from the shared capability table.

Method names live only in serving/contract/methods.py. This module maps each capability part
(a drafter kind, a verifier kind) to its builder, so METHODS here is derived from the contract
row by row; what a built method needs at run time (target layers to capture, tree attention,
verify width) comes from the built parts, never from the name. Heavy parts import lazily so
that lookups and the config-only preflight need no torch.
"""

from __future__ import annotations

from dataclasses import replace

from serving import contract

from .base import Drafter, Method, MethodSpec, Needs, PreflightError, SpecOptions, Verifier


def _dflash_drafter(target, options: SpecOptions) -> Drafter:
    from .dflash import DFlashDrafter, load_for, load_vocab

    model = load_for(target, options.draft_path)
    vocab = load_vocab(options.draft_path, target.config.vocab_size) if options.draft_vocab else None
    return DFlashDrafter(model, target, options.block_size, vocab)


def _chain_verifier(options: SpecOptions, draft_config: dict) -> Verifier:
    from .chain import ChainVerifier

    return ChainVerifier(options.block_size)


def _tree_verifier(options: SpecOptions, draft_config: dict) -> Verifier:
    from .ddtree import TreeVerifier

    return TreeVerifier(options.budget)


DRAFTERS = {contract.DFLASH_DRAFTER: _dflash_drafter}
VERIFIERS = {contract.CHAIN: _chain_verifier, contract.TREE: _tree_verifier}


def _spec(name: str, caps: contract.Method) -> MethodSpec:
    if not caps.is_speculative:
        return MethodSpec(name)
    return MethodSpec(name, drafter=DRAFTERS[caps.drafter], verifier=VERIFIERS[caps.verifier],
                      takes_budget=caps.uses_tree_budget, caps=caps)


METHODS: dict[str, MethodSpec] = {name: _spec(name, caps) for name, caps in contract.METHODS.items()}


def resolve(name: str | None) -> MethodSpec:
    """Case-insensitive lookup (SGLang spells them NONE, DFLASH, DDTREE); None means plain."""
    key = (name or "none").strip().lower()
    if key not in METHODS:
        raise ValueError(f"unknown speculative algorithm {name!r} (choose from {', '.join(m.upper() for m in METHODS)})")
    return METHODS[key]


def target_config(target) -> dict:
    """The target facts preflight reads, from a loaded model's config."""
    cfg = target.config
    return {k: getattr(cfg, k) for k in ("hidden_size", "num_hidden_layers", "vocab_size")}


def resolve_options(spec: MethodSpec, options: SpecOptions, draft_config: dict) -> SpecOptions:
    """Fill block size (draft config) and budget (block_size - 1, tree methods only)."""
    block = options.block_size if options.block_size is not None else draft_config.get("block_size")
    budget = spec.caps.tree_budget(block or 2, options.budget) if spec.caps else None
    return replace(options, block_size=block, budget=budget)


def build(spec: MethodSpec, target, options: SpecOptions) -> Method | None:
    """Check the pair (config, then weights), then build drafter + verifier; None for plain."""
    if not spec.speculative:
        return None
    from . import preflight

    if not options.draft_path:
        raise PreflightError(f"{spec.name} needs --speculative-draft-model-path")
    draft_config = preflight.read_config(options.draft_path)
    options = resolve_options(spec, options, draft_config)
    checks = dict(block_size=options.block_size, budget=options.budget)
    preflight.check(draft_config, target_config(target), **checks)
    drafter = spec.drafter(target, options)
    preflight.check(draft_config, target_config(target), fc_in=drafter.feature_width, **checks)
    return Method(spec.name, drafter, spec.verifier(options, draft_config))


__all__ = ["METHODS", "Method", "MethodSpec", "Needs", "PreflightError", "SpecOptions", "build", "resolve"]
