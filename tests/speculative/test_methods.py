"""METHODS: lookup, needs derived from parts, capture exactly what is needed, names only in the table."""

import ast
import json
from pathlib import Path

import pytest

from serving.engine.build import runner_factory
from serving.speculative import METHODS, Needs, SpecOptions, build, resolve
from tests.rounds import tokens
from serving.sampling import SamplingParams

REPO = Path(__file__).resolve().parents[2]


class Recorder:
    """The real target, with every forward's `capture` argument written down (the runner's
    forwards: a packed forward, a plain decode step; serving.models.batched)."""

    def __init__(self, target):
        self.target, self.captures = target, []

    def __getattr__(self, name):
        return getattr(self.target, name)

    def forward_packed(self, *args, capture=(), **kw):
        self.captures.append(tuple(capture))
        return self.target.forward_packed(*args, capture=capture, **kw)

    def decode_step(self, *args, capture=(), **kw):
        self.captures.append(tuple(capture))
        return self.target.decode_step(*args, capture=capture, **kw)


@pytest.mark.parametrize("spelling, name", [("DDTREE", "ddtree"), ("dflash", "dflash"), ("DFlash", "dflash"),
                                            (None, "none"), ("NONE", "none"), (" ddtree ", "ddtree")])
def test_resolve_is_case_insensitive(spelling, name):
    assert resolve(spelling) is METHODS[name]


def test_unknown_method_lists_the_choices():
    with pytest.raises(ValueError, match="unknown speculative algorithm 'eagle' .choose from NONE, DFLASH, DDTREE"):
        resolve("eagle")


def test_server_names_are_sglang_spellings():
    assert [m.server_name for m in METHODS.values()] == [None, "DFLASH", "DDTREE"]


@pytest.mark.parametrize("name", sorted(METHODS))
def test_needs_are_the_union_of_the_parts(name, targets, random_drafts):
    draft_config = json.loads((random_drafts["qwen3"] / "config.json").read_text())
    method = build(METHODS[name], targets["qwen3"], SpecOptions(draft_path=str(random_drafts["qwen3"])))
    if not METHODS[name].speculative:
        assert method is None
        return
    assert method.needs == method.drafter.needs | method.verifier.needs
    # every method built on the DFlash drafter captures the draft's taps, with nothing to remember
    assert method.needs.target_layers == tuple(draft_config["dflash_config"]["target_layer_ids"])
    assert method.needs.draft_tokens >= draft_config["block_size"] or not method.needs.tree_attention
    assert method.needs.tree_attention == METHODS[name].takes_budget


@pytest.mark.parametrize("name", sorted(METHODS))
def test_runner_captures_exactly_the_needed_layers(name, targets, random_drafts):
    recorder = Recorder(targets["llama"])
    spec = METHODS[name]
    runner = runner_factory(recorder, 256, spec, SpecOptions(draft_path=str(random_drafts["llama"])))()
    needed = runner.spec.method.needs.target_layers if spec.speculative else Needs().target_layers
    assert len(tokens(runner, [5, 6, 7, 8], SamplingParams(temperature=0), 12)) == 12
    assert len(recorder.captures) >= 2
    assert set(recorder.captures) == {needed}


def test_default_budget_is_block_minus_one(targets, random_drafts):
    method = build(METHODS["ddtree"], targets["llama"], SpecOptions(draft_path=str(random_drafts["llama"])))
    block = json.loads((random_drafts["llama"] / "config.json").read_text())["block_size"]
    assert method.verifier.budget == block - 1
    assert method.needs.draft_tokens == block  # budget + 1 rows


@pytest.mark.parametrize("name", sorted(METHODS))
@pytest.mark.parametrize("block, budget", [(None, None), (3, None), (3, 9), (8, 2)])
def test_a_built_methods_verify_rows_are_the_contracts(name, block, budget, targets, random_drafts):
    """The verify rows both predictions use (serving.memory, ddops fit) are the built parts' own:
    one rule, read from the method's capabilities (contract Method.verify_rows)."""
    spec = METHODS[name]
    trained = json.loads((random_drafts["llama"] / "config.json").read_text())["block_size"]
    options = SpecOptions(draft_path=str(random_drafts["llama"]), block_size=block,
                          budget=budget if spec.takes_budget else None)
    method = build(spec, targets["llama"], options)
    expected = spec.verify_rows(block or trained, options.budget)
    assert (method.needs.draft_tokens if method else 0) == expected
    if spec.takes_budget:
        assert expected == max(block or trained, (budget or (block or trained) - 1) + 1)
    elif spec.speculative:
        assert expected == (block or trained)


def _name_comparisons(source: str, names: set[str]) -> list[int]:
    """Line numbers where a string literal naming a method is compared (==, !=, in ...)."""
    hits = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            for operand in operands:
                items = operand.elts if isinstance(operand, (ast.Tuple, ast.List, ast.Set)) else [operand]
                for item in items:
                    if isinstance(item, ast.Constant) and isinstance(item.value, str) and item.value.lower() in names:
                        hits.append(node.lineno)
    return hits


def test_no_code_outside_the_table_compares_a_method_name():
    table = REPO / "serving/contract/methods.py"
    # in ddops, "none" is also other tools' keyword (ssh_config's `ProxyJump none`): there the
    # scan looks for the speculative methods' names
    speculative = {name for name, spec in METHODS.items() if spec.speculative}
    scans = [(f, set(METHODS)) for f in (REPO / "serving").rglob("*.py")]
    scans += [(f, speculative) for f in (REPO / "ddops").rglob("*.py")]
    hits = [f"{f.relative_to(REPO)}:{line}" for f, names in sorted(scans) if f != table
            for line in _name_comparisons(f.read_text(), names)]
    assert hits == []


def test_the_name_scan_finds_comparisons():
    source = 'a = 1\nif algo == "DDTREE":\n    pass\nok = x in ("none", "other")\nfine = "dflash"\n'
    assert _name_comparisons(source, set(METHODS)) == [2, 4]
