"""A draft's vLLM form (serving.tools.vllm_draft): d2t and the head rows say what draft_vocab.json
says, in its order; the bundled runtime loads the exported folder and decodes exactly as before;
and (smollm) vLLM 0.32 loads such a folder and proposes over that vocabulary."""

from __future__ import annotations

import json
import re
import shutil
from collections import Counter
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from serving.contract import pairing
from serving.models.tokenizer import Tokenizer
from serving.sampling import SamplingParams
from serving.engine.build import runner_factory
from serving.speculative import SpecOptions, resolve
from tests.rounds import rounds
from serving.speculative.dflash import load_vocab
from serving.tools.draft_vocab import write_vocab
from serving.tools.vllm_draft import VLLM_FILE, export, vllm_tensors
from tests.vllm_env import vllm_python
from tests.vllm_server import vllm_running
from tests.vllm_server import smollm2_checkpoint  # noqa: F401  (a fixture)

QUESTIONS = ("Hello, who are you?", "Why is the sky blue?", "Name three colours.")
MAX_NEW = 48  # tokens per answer in the vLLM comparison


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
    runner = runner_factory(target, 256, resolve("dflash"), SpecOptions(draft_path=str(draft)))()
    runs = []
    for prompt in prompts:
        first, *steps = rounds(runner, prompt, SamplingParams(temperature=0.0), max_new)
        runs.append((first + [t for r in steps for t in r], [len(r) for r in steps]))
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


def assert_vllm_form(draft: Path, target) -> None:
    """The folder's d2t, head rows and draft_vocab_size say what its draft_vocab.json says."""
    ids = load_vocab(draft, target.config.vocab_size)
    tensors, config = load_file(draft / VLLM_FILE), json.loads((draft / "config.json").read_text())
    assert (torch.arange(len(ids)) + tensors["d2t"]).tolist() == ids and config["draft_vocab_size"] == len(ids)
    assert torch.equal(tensors["lm_head.weight"], target.lm_head_weight[torch.tensor(ids)])


def test_drafter_and_draft_vocab_commands_write_the_vllm_form(targets, tiny_dirs, tmp_path):
    from serving.tools import draft_vocab
    from serving.tools.drafter import __main__ as drafter

    target, out = targets["llama"], tmp_path / "draft"
    assert drafter.main(["--target", str(tiny_dirs["llama"]), "--out", str(out), "--answers", str(tmp_path / "a"),
                         "--prompts", "3", "--sample-every", "0", "--max-new", "8", "--steps", "1",
                         "--vocab-size", "48", "--block", "4", "--taps", "1,2", "--answers-per-step", "1",
                         "--anchors", "1", "--eval-every", "1"]) == 0
    assert_vllm_form(out, target)
    assert draft_vocab.main(["--target", str(tiny_dirs["llama"]), "--draft", str(out), "--size", "20",
                             "--corpus-chars", "3000", "--answer-tokens", "4"]) == 0
    assert len(load_vocab(out, target.config.vocab_size)) == 20
    assert_vllm_form(out, target)


def vllm_counters(url: str) -> dict[str, float]:
    """vLLM's spec-decode counters from /metrics: name (with `[position]` for the per-position
    one) -> value, summed over the other labels."""
    import httpx

    found: dict[str, float] = {}
    for line in httpx.get(f"{url}/metrics", timeout=30, trust_env=False).text.splitlines():
        match = re.match(r"(vllm:spec_decode_\w+_total)(\{[^}]*\})? (\S+)$", line)
        if match:
            position = re.search(r'position="(\d+)"', match[2] or "")
            name = match[1] + (f"[{position[1]}]" if position else "")
            found[name] = found.get(name, 0.0) + float(match[3])
    return found


def vllm_completion(url: str, prompt: list[int], max_tokens: int) -> list[int]:
    import httpx

    body = {"model": "smollm2-135m-instruct", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
            "ignore_eos": True, "return_token_ids": True}
    answer = httpx.post(f"{url}/v1/completions", json=body, timeout=300, trust_env=False)
    assert answer.status_code == 200, answer.text
    return answer.json()["choices"][0]["token_ids"]


@pytest.fixture(scope="module")
def vllm() -> str:
    return vllm_python()  # skips (or fails under DDOPS_REQUIRE_VLLM=1) without the venv


@pytest.fixture(scope="module")
def smollm2_reduced_draft(vllm, smollm2_checkpoint, tmp_path_factory):
    """A SmolLM2-shaped random DFlash draft (1 layer, taps 1,15,27, block 8) whose vocabulary is
    the 16 tokens the target says most in its greedy answers, shuffled; exported for vLLM."""
    from serving.tools.draft_files import draft_config, random_model, save_draft
    from serving.tools.draft_vocab import most_frequent
    from serving.tools.train_draft import load_target

    target = load_target(smollm2_checkpoint, positions=256)
    tokenizer = Tokenizer.from_dir(smollm2_checkpoint)
    prompts = [tokenizer.encode_chat([{"role": "user", "content": q}]) for q in QUESTIONS]
    raw = json.loads((smollm2_checkpoint / "config.json").read_text())
    config = draft_config(raw, layers=1, block_size=8, taps=[1, 15, 27], mask_token_id=0)
    draft = save_draft(random_model(config, seed=5), config, tmp_path_factory.mktemp("smollm2-draft") / "d")
    plain = decode(target, draft, prompts, MAX_NEW + 8)  # full vocabulary: the target's own greedy tokens
    said = most_frequent(Counter(t for out, _ in plain for t in out), 16)
    ids = [said[i] for i in shuffled_subset(len(said), len(said))]
    write_vocab(draft, ids, Counter(), "the target's most said tokens, shuffled (a test)")
    export(draft, ids, target.lm_head_weight)
    return smollm2_checkpoint, target, prompts, draft


def rounds_before(rounds: list[int], max_new: int) -> list[int]:
    """The rounds a decoder runs until `max_new` tokens are out (the first comes from prefill)."""
    out, kept = 1, []
    for n in rounds:
        if out >= max_new:
            break
        kept.append(n)
        out += n
    return kept


@pytest.mark.smollm
def test_vllm_proposes_over_the_exported_vocabulary_as_the_bundled_runtime_does(vllm, smollm2_reduced_draft,
                                                                                 tmp_path):
    """vLLM 0.32 loads the exported folder (d2t, head rows, draft_vocab_size) and, on the same
    prompts, drafts and accepts exactly what the bundled runtime's DFlash chain does with the
    same draft: same vocabulary map, same head rows, same target layers."""
    checkpoint, target, prompts, draft = smollm2_reduced_draft
    bundled = decode(target, draft, prompts, MAX_NEW + 8)  # + 8: no round shortened before MAX_NEW
    spec = json.dumps({"method": "dflash", "model": str(draft), "num_speculative_tokens": 7})
    with vllm_running(vllm, checkpoint, tmp_path, "--speculative-config", spec, timeout_s=300) as server:
        served = [vllm_completion(server.url, p, MAX_NEW) for p in prompts]
        counters = vllm_counters(server.url)
    rounds = [n for _, r in bundled for n in rounds_before(r, MAX_NEW)]  # tokens per round
    print(f"bundled: {len(rounds)} rounds, {sum(rounds) - len(rounds)} accepted; vLLM: {counters}")
    assert served == [out[:MAX_NEW] for out, _ in bundled]  # lossless on both
    assert counters["vllm:spec_decode_num_drafts_total"] == len(rounds)
    assert counters["vllm:spec_decode_num_draft_tokens_total"] == 7 * len(rounds)
    assert counters["vllm:spec_decode_num_accepted_tokens_total"] == sum(rounds) - len(rounds) > 0
    for position in range(7):
        assert counters[f"vllm:spec_decode_num_accepted_tokens_per_pos_total[{position}]"] == \
            sum(n - 1 > position for n in rounds), position
