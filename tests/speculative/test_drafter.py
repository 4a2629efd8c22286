"""serving.tools.drafter on the tiny targets: the data is the runtime's own output, the held-out
tau is what a DFlash round accepts, and training resumes exactly."""

from __future__ import annotations

import json
from collections import Counter
from functools import partial

import torch

from serving.engine import Engine, StopRule
from serving.engine.batch import BatchRunner
from serving.models.tokenizer import Tokenizer
from serving.sampling import SamplingParams
from serving.engine.build import runner_factory
from serving.speculative import SpecOptions, resolve
from tests.rounds import rounds as engine_rounds
from serving.speculative.dflash import load_model as load_draft
from serving.speculative.dflash import load_vocab
from serving.tools.drafter import __main__ as cli
from serving.tools.drafter.loop import Settings, Trainer
from serving.tools.drafter.objective import accepted_lengths, held_out_tau
from serving.tools.drafter.prompts import held_out_prompts, training_prompts
from serving.tools.drafter.responses import Request, answer_batch
from serving.tools.draft_files import draft_config, random_model
from serving.tools.draft_vocab import most_frequent, write_vocab

QUESTIONS = ("Hello, who are you?", "Write a Python function that adds numbers.", "Why is the sky blue?",
             "Name three colours.", "What is a list?")


def chat_requests(tokenizer, sampling: SamplingParams, max_new: int) -> list[Request]:
    return [Request(tokenizer.encode_chat([{"role": "user", "content": q}]),
                    SamplingParams(temperature=sampling.temperature, seed=(sampling.seed or 0) + i), max_new)
            for i, q in enumerate(QUESTIONS)]


def engine_outputs(target, tokenizer, requests, stop_ids) -> list[list[int]]:
    engine = Engine(partial(BatchRunner, target, None, capacity=256), tokenizer).start()
    try:
        return [list(engine.generate(r.prompt, r.sampling, StopRule(r.max_new, stop_ids=stop_ids)).token_ids)
                for r in requests]
    finally:
        engine.stop()


def test_answers_are_the_runtimes_output_with_teacher_forced_features(targets, tiny_dirs):
    """Greedy and seeded-sampled answers equal what the engine serves for the same chat
    requests; features and picks equal one teacher-forced pass over the answer."""
    target, tokenizer = targets["llama"], Tokenizer.from_dir(tiny_dirs["llama"])
    stop_ids = frozenset(tokenizer.eos_ids)
    for sampling in (SamplingParams(temperature=0.0), SamplingParams(temperature=0.9, seed=7)):
        requests = chat_requests(tokenizer, sampling, 12)
        answers = answer_batch(target, requests, (1, 2), stop_ids)
        served = engine_outputs(target, tokenizer, requests, stop_ids)
        for answer, out in zip(answers, served):
            response = answer.tokens[answer.prompt_len:].tolist()
            assert response == out[:len(response)] and len(out) == len(response) + 1
            if sampling.greedy:
                assert int(answer.picks[-1]) == out[-1]
    answer = answers[0]
    n = answer.tokens.numel()
    logits, hidden = target.forward(answer.tokens, torch.arange(n), target.new_cache(n), capture=(1, 2))
    torch.testing.assert_close(answer.feats.float(), hidden, atol=2e-3, rtol=2e-3)  # stored as fp16
    p = answer.prompt_len - 1  # picks inside the prompt are no labels: stored as -1
    assert torch.equal(answer.picks[p:], logits.argmax(-1)[p:]) and (answer.picks[:p] == -1).all()


def test_simulated_round_accepts_what_the_engine_accepts(targets, tiny_dirs, distilled_drafts):
    """accepted_lengths at the anchors where a real DFlash decode started its rounds gives each
    round's committed count, exactly."""
    target, tokenizer = targets["llama"], Tokenizer.from_dir(tiny_dirs["llama"])
    model = load_draft(distilled_drafts["llama"], torch.float32, "cpu")
    runner = runner_factory(target, 256, resolve("dflash"), SpecOptions(draft_path=str(distilled_drafts["llama"])))()
    head, vocab = target.lm_head_weight, torch.arange(target.lm_head_weight.shape[0])
    block, every = model.cfg.block_size, []
    for request in chat_requests(tokenizer, SamplingParams(temperature=0.0), 40):
        answer = answer_batch(target, [request], model.cfg.target_layer_ids, frozenset())[0]
        first, *steps = engine_rounds(runner, request.prompt, request.sampling, request.max_new)
        out, anchors, rounds = first, [], []
        for step in steps:
            if len(out) + block > request.max_new - 1:  # full-depth rounds inside the answer only
                break
            anchors.append(answer.prompt_len + len(out) - 1)  # the bonus token's position
            rounds.append(len(step))
            out = out + step
        simulated = accepted_lengths(model, target, head, vocab, answer, torch.tensor(anchors, dtype=torch.long))
        assert simulated.tolist() == rounds
        every += rounds
    assert len(every) >= 5 and max(every) > 1, every


def tiny_trainer(target, target_dir, answers, folder, steps: int) -> Trainer:
    config = draft_config(json.loads((target_dir / "config.json").read_text()), layers=1, block_size=4, taps=[1, 2])
    vocab = torch.arange(target.lm_head_weight.shape[0])
    settings = Settings(steps=steps, warmup=2, answers_per_step=2, anchors_per_answer=3, eval_every=4,
                        checkpoint_every=3)
    return Trainer(random_model(config, 0), target, target.lm_head_weight, vocab, answers, answers[:1],
                   settings, folder)


def test_training_resumed_from_a_checkpoint_ends_where_an_uninterrupted_run_ends(targets, tiny_dirs, tmp_path):
    target, tokenizer = targets["llama"], Tokenizer.from_dir(tiny_dirs["llama"])
    answers = answer_batch(target, chat_requests(tokenizer, SamplingParams(temperature=0.0), 16), (1, 2),
                           frozenset())
    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()
    straight = tiny_trainer(target, tiny_dirs["llama"], answers, tmp_path / "a", steps=8)
    straight.run()
    killed = tiny_trainer(target, tiny_dirs["llama"], answers, tmp_path / "b", steps=8)
    for _ in range(5):
        killed.train_step()
    killed.save()
    killed.train_step()  # lost with the process: after the last checkpoint
    resumed = tiny_trainer(target, tiny_dirs["llama"], answers, tmp_path / "b", steps=8)
    assert resumed.resume() and resumed.step == 5
    resumed.run()
    assert resumed.step == straight.step == 8
    for name, weight in straight.model.state_dict().items():
        assert torch.equal(weight, resumed.model.state_dict()[name]), name
    assert torch.equal(straight.gen.get_state(), resumed.gen.get_state())


def test_command_trains_resumes_and_writes_a_loadable_draft(tiny_dirs, tmp_path):
    """Two runs of the command: the second resumes the first's checkpoint (a longer budget
    continues it), the log grows, the draft and its vocabulary load as the runtime loads them."""
    out = tmp_path / "draft"
    common = ["--target", str(tiny_dirs["llama"]), "--out", str(out), "--answers", str(tmp_path / "answers"),
              "--prompts", "6", "--sample-every", "3", "--max-new", "12", "--minutes", "0", "--eval-every", "5", "--checkpoint-every", "5",
              "--vocab-size", "64", "--block", "4", "--taps", "1,2", "--answers-per-step", "2", "--anchors", "2"]
    assert cli.main(common + ["--steps", "5"]) == 0
    log = out.with_name("draft.train") / "log.jsonl"
    assert [e["step"] for e in map(json.loads, log.read_text().splitlines())] == [0, 5]
    assert cli.main(common + ["--prompts", "9", "--steps", "10"]) == 0  # more answers, same vocabulary
    entries = [json.loads(line) for line in log.read_text().splitlines()]
    assert [e["step"] for e in entries] == [0, 5, 10] and all(e["tau"] >= 1.0 for e in entries)
    model = load_draft(out, torch.float32, "cpu")
    vocab = load_vocab(out, model.cfg.vocab_size)
    assert model.cfg.block_size == 4 and 0 < len(vocab) <= 64
    assert vocab == json.loads((log.parent / "vocab.json").read_text())  # what the head was trained over
    assert cli.main(common + ["--steps", "10", "--layers", "3"]) == 2  # another shape: not resumed silently


def test_vocabulary_is_the_most_picked_ids_and_loads_as_the_runtime_loads_it(tmp_path):
    """The one FR-Spec writer (the drafter and serving.tools.draft_vocab): most counted first,
    ties by lower id, and the share of all picks the kept ids cover."""
    counts = Counter({5: 3, 2: 3, 9: 1, 7: 4})
    ids = most_frequent(counts, 3)
    assert ids == [7, 2, 5]
    write_vocab(tmp_path, ids, counts, "a test")
    assert load_vocab(tmp_path, 10) == [7, 2, 5]
    assert json.loads((tmp_path / "draft_vocab.json").read_text())["coverage"] == round(10 / 11, 4)


def test_training_prompts_hold_out_the_bench_and_mix_kinds():
    prompts = training_prompts(300)
    assert len(prompts) == len(set(prompts)) == 300 and prompts == training_prompts(300)
    assert not set(prompts) & set(held_out_prompts())
    assert sum("`" in p or "Python documentation" in p for p in prompts) >= 90  # docstring questions
    assert sum(p.startswith("Write a Python") for p in prompts) >= 90  # code tasks and API examples


def test_plot_draws_a_png(tmp_path):
    from serving.tools.drafter.plot import main as plot

    log = tmp_path / "log.jsonl"
    log.write_text("\n".join(json.dumps({"step": s, "minutes": s / 10, "tau": 1 + s / 100}) for s in (0, 50, 100)))
    assert plot([f"{log}=recipe", "--out", str(tmp_path / "tau.png"), "--baseline", "1.1"]) == 0
    assert (tmp_path / "tau.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_answer_cache_resumes_and_a_longer_list_reuses_its_shards(targets, tiny_dirs, tmp_path):
    from serving.tools.drafter.responses import cached_answers

    target, tokenizer = targets["llama"], Tokenizer.from_dir(tiny_dirs["llama"])
    requests = chat_requests(tokenizer, SamplingParams(temperature=0.0), 8)
    first = cached_answers(target, requests[:4], (1, 2), "base", frozenset(), tmp_path, shard=2)
    made = [(path, path.stat().st_mtime_ns) for path in tmp_path.glob("shard-*.pt")]
    assert len(made) == 2
    longer = cached_answers(target, requests, (1, 2), "base", frozenset(), tmp_path, shard=2)
    assert len(list(tmp_path.glob("shard-*.pt"))) == 3 and all(p.stat().st_mtime_ns == t for p, t in made)  # not redone
    assert all(torch.equal(a.tokens, b.tokens) for a, b in zip(first, longer))
    other = cached_answers(target, requests[:2], (1, 2), "another target", frozenset(), tmp_path, shard=2)
    assert len(other) == 2 and len(list(tmp_path.glob("shard-*.pt"))) == 4  # the base digest names shards
