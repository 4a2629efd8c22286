"""A draft's vLLM form (serving.tools.vllm_draft): d2t and the head rows say what draft_vocab.json
says, in its order; the bundled runtime loads the exported folder and decodes exactly as before;
and (smollm) vLLM 0.32 loads such a folder and proposes over that vocabulary."""

from __future__ import annotations

import json
import shutil
from collections import Counter
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from serving.contract import pairing
from serving.models.tokenizer import Tokenizer
from serving.sampling import SamplingParams
from serving.speculative import SpecOptions, decoder_factory, resolve
from serving.speculative.dflash import load_vocab
from serving.tools.draft_vocab import write_vocab
from serving.tools.vllm_draft import VLLM_FILE, export, vllm_tensors

QUESTIONS = ("Hello, who are you?", "Why is the sky blue?", "Name three colours.")


def shuffled_subset(vocab_size: int, size: int, seed: int = 3) -> list[int]:
    """`size` distinct ids in no particular order, so an identity map would fail."""
    return torch.randperm(vocab_size, generator=torch.Generator().manual_seed(seed))[:size].tolist()


def scattered(reduced: torch.Tensor, d2t: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """vLLM's compute_logits: draft row i's logit lands at target id i + d2t[i], the rest -inf."""
    full = reduced.new_full((reduced.shape[0], vocab_size), float("-inf"))
    full[:, torch.arange(d2t.shape[0]) + d2t] = reduced
    return full


def decode(target, draft: Path, prompts: list[list[int]], max_new: int = 24):
    """(tokens, tokens per round) of the bundled runtime's DFlash decoder on each prompt."""
    decoder = decoder_factory(resolve("dflash"), target, SpecOptions(draft_path=str(draft)), capacity=256)()
    runs = []
    for prompt in prompts:
        out, rounds = decoder.start(prompt, SamplingParams(temperature=0.0), max_new), []
        while len(out) < max_new:
            rounds.append(decoder.step())
            out += rounds[-1]
        runs.append((out, [len(r) for r in rounds]))
    return runs


def test_d2t_maps_every_draft_row_to_its_draft_vocab_id_in_order(targets, tiny_dirs, random_drafts, tmp_path):
    target, raw = targets["llama"], json.loads((tiny_dirs["llama"] / "config.json").read_text())
    vocab_size, draft = raw["vocab_size"], shutil.copytree(random_drafts["llama"], tmp_path / "draft")
    ids = shuffled_subset(vocab_size, 40)
    write_vocab(draft, ids, Counter(), "a test")
    export(draft, load_vocab(draft, vocab_size), target.lm_head_weight)
    tensors, config = load_file(draft / VLLM_FILE), json.loads((draft / "config.json").read_text())
    d2t, head = tensors["d2t"], tensors["lm_head.weight"]
    assert d2t.dtype == torch.int64 and d2t.shape == (40,) and head.shape == (40, raw["hidden_size"])
    assert (torch.arange(40) + d2t).tolist() == ids
    assert torch.equal(head, target.lm_head_weight[torch.tensor(ids)])
    assert config["draft_vocab_size"] == 40 and config["vocab_size"] == vocab_size
    # vLLM's scatter puts every row's logit at its id: its argmax is the id the bundled drafter picks
    reduced = torch.randn(5, 40, generator=torch.Generator().manual_seed(0))
    assert scattered(reduced, d2t, vocab_size).argmax(-1).tolist() == [ids[i] for i in reduced.argmax(-1)]
    assert not pairing.problems(config, raw)


def test_bundled_runtime_decodes_the_exported_folder_as_before(targets, tiny_dirs, distilled_drafts, tmp_path):
    """Same tokens and same accepted tokens per round before and after the export."""
    target, tokenizer = targets["llama"], Tokenizer.from_dir(tiny_dirs["llama"])
    draft = shutil.copytree(distilled_drafts["llama"], tmp_path / "draft")
    vocab_size = target.config.vocab_size
    prompts = [tokenizer.encode_chat([{"role": "user", "content": q}]) for q in QUESTIONS]
    said = {t for out, _ in decode(target, draft, prompts) for t in out}  # full vocabulary
    pool = sorted(said) + [t for t in range(vocab_size) if t not in said][:vocab_size // 2]
    ids = [pool[i] for i in shuffled_subset(len(pool), len(pool))]  # what it says, and more, shuffled
    write_vocab(draft, ids, Counter(), "a test")
    before = decode(target, draft, prompts)
    assert max(n for _, rounds in before for n in rounds) > 1  # drafts are accepted: proposals matter
    export(draft, load_vocab(draft, vocab_size), target.lm_head_weight)
    assert (draft / VLLM_FILE).is_file()
    assert decode(target, draft, prompts) == before


def test_full_vocabulary_needs_no_vllm_form(targets, random_drafts, tmp_path):
    """vLLM shares the target's head when the vocabulary is all of it; a stale form is removed."""
    target, draft = targets["llama"], shutil.copytree(random_drafts["llama"], tmp_path / "draft")
    vocab_size = target.config.vocab_size
    export(draft, [5, 1], target.lm_head_weight)
    assert json.loads((draft / "config.json").read_text())["draft_vocab_size"] == 2
    export(draft, list(range(vocab_size)), target.lm_head_weight)
    assert not (draft / VLLM_FILE).exists()
    assert "draft_vocab_size" not in json.loads((draft / "config.json").read_text())
    assert vllm_tensors([5, 1], target.lm_head_weight)["d2t"].tolist() == [5, 0]
