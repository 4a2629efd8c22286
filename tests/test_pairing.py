"""One table of good and bad draft/target pairs, run through both sides' checks: ddops's
preflight on the files (what deploy refuses before touching a host) and the runtime's start-up
check (what `python -m serving` refuses before serving). They must agree pair for pair, reason
for reason: a draft that passes `ddops preflight` starts, and one that would not start is refused.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from ddops.draft_pairing import LocalFiles, check_pair, read_pair
from serving import contract, speculative
from serving.models import inspect_checkpoint, load_model
from serving.tools.tiny import write_tiny
from serving.tools.tiny_draft import draft_config, random_model, save_draft

CHAIN = next(name for name, m in contract.METHODS.items() if m.is_speculative and not m.uses_tree_budget)
TREE = next(name for name, m in contract.METHODS.items() if m.uses_tree_budget)


def _with(**dflash):
    return lambda c: {**c, "dflash_config": {**c["dflash_config"], **dflash}}


def _drop_mask(c):
    return {**c, "dflash_config": {"target_layer_ids": c["dflash_config"]["target_layer_ids"]}}


# (case, draft config change, method, block size asked for, tree budget asked for)
PAIRS = [
    ("matching", lambda c: c, CHAIN, None, None),
    ("matching tree", lambda c: c, TREE, 4, 3),
    ("width: draft made for a wider target", lambda c: {**c, "hidden_size": 96, "head_dim": 24}, CHAIN, None, None),
    ("tapped layer missing", _with(target_layer_ids=[1, 9]), CHAIN, None, None),
    ("mask token outside the vocabulary", _with(mask_token_id=10**6), CHAIN, None, None),
    ("mask token missing", _drop_mask, CHAIN, None, None),
    ("built for another depth", lambda c: {**c, "num_target_layers": 7}, TREE, None, None),
    ("vocabulary differs", lambda c: {**c, "vocab_size": c["vocab_size"] + 1}, CHAIN, None, None),
    ("block larger than trained", lambda c: c, CHAIN, 64, None),
    ("zero tree budget", lambda c: c, TREE, None, 0),
]


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    path = write_tiny(tmp_path_factory.mktemp("pair") / "target", "llama")
    return path, load_model(inspect_checkpoint(path), torch.float32, "cpu", 256)


def write_draft(target_dir: Path, out: Path, change) -> Path:
    good = draft_config(json.loads((target_dir / "config.json").read_text()))
    config = change(good)
    try:
        model = random_model(config, seed=0)
    except (KeyError, TypeError, ValueError):  # a config the model cannot be built from: weights of the good one
        model = random_model(good, seed=0)
    save_draft(model, good, out)
    (out / "config.json").write_text(json.dumps(config))
    return out


@pytest.mark.parametrize("case, change, method, block, budget", PAIRS, ids=[p[0] for p in PAIRS])
def test_ops_preflight_and_runtime_start_agree(target, tmp_path, case, change, method, block, budget):
    target_dir, model = target
    draft = write_draft(target_dir, tmp_path / "draft", change)
    ops = check_pair(read_pair(LocalFiles(), str(target_dir), str(draft)), block, budget)
    suffix = f" (draft {draft}, target {target_dir})"
    assert all(p.reason.endswith(suffix) for p in ops)
    ops_reasons = [p.reason.removesuffix(suffix) for p in ops]
    options = speculative.SpecOptions(draft_path=str(draft), block_size=block, budget=budget)
    if case.startswith("matching"):
        assert ops_reasons == []
        assert speculative.build(speculative.METHODS[method], model, options) is not None
        return
    assert ops_reasons, f"{case}: ddops preflight found nothing"
    with pytest.raises(speculative.PreflightError) as refused:
        speculative.build(speculative.METHODS[method], model, options)
    assert str(refused.value) == "; ".join(ops_reasons)


def test_both_sides_build_every_method_of_the_contract():
    """The runtime's METHODS is derived row by row from the contract's; nothing else names a method."""
    assert list(speculative.METHODS) == list(contract.METHODS)
    for name, caps in contract.METHODS.items():
        built = speculative.METHODS[name]
        assert built.speculative == caps.is_speculative
        assert built.takes_budget == caps.uses_tree_budget
