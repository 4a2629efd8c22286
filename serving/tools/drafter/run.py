"""One training run end to end: target answers -> vocabulary -> resumable training -> draft files."""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path

import torch

from serving.speculative.dflash2_model import identity_
from serving.tools.draft_files import random_model, save_draft
from serving.tools.draft_vocab import most_frequent, write_vocab
from serving.tools.train_draft import load_target
from serving.tools.vllm_draft import vllm_config, write_tensors

from .loop import Settings, Trainer
from .progress import TrainingReport, bar
from .prompts import held_out_prompts, training_prompts


def gather(args, config: dict, console):
    """(target, training answers, held-out answers): answered by the target, cached in --answers."""
    from serving.models import inspect_checkpoint
    from serving.models.tokenizer import Tokenizer

    from .responses import target_digest

    checkpoint = inspect_checkpoint(args.target)
    tokenizer = Tokenizer.from_dir(args.target)
    stop_ids = frozenset(checkpoint.config.eos_token_ids) | frozenset(tokenizer.eos_ids)
    taps = tuple(config["dflash_config"]["target_layer_ids"])
    train_req = requests_for(tokenizer, training_prompts(args.prompts, args.seed), args.sample_every,
                             args.max_new, args.seed)
    held_req = requests_for(tokenizer, held_out_prompts(), 0, args.max_new, args.seed)
    longest = max(len(r.prompt) for r in train_req + held_req) + args.max_new + args.block + 1
    target = load_target(args.target, positions=longest)
    base = target_digest(args.target, taps)
    held_out = answers_for(target, held_req, taps, base, stop_ids, args.answers, "held-out", console)
    answers = answers_for(target, train_req, taps, base, stop_ids, args.answers, "training", console)
    return target, answers, held_out


def train_and_save(args, config: dict, folder, console) -> None:
    target, answers, held_out = gather(args, config, console)
    tokens = sum(a.tokens.numel() - a.prompt_len for a in answers)
    console.log(f"{len(answers)} training answers ({tokens} response tokens), {len(held_out)} held-out "
                f"(the bench prompts)")
    ids = saved_or_new(folder, "vocab.json", lambda: choose_vocab(answers, args.vocab_size))
    vocab = torch.tensor(ids)
    head = target.lm_head_weight[vocab].contiguous()  # [V', H]: the target's rows, as the drafter runs
    model = initial_draft(config, target, args.seed)
    settings = Settings(steps=args.steps, minutes=args.minutes, lr=args.lr, answers_per_step=args.answers_per_step,
                        anchors_per_answer=args.anchors, eval_every=args.eval_every,
                        checkpoint_every=args.checkpoint_every, seed=args.seed)
    trainer = Trainer(model, target, head, vocab, answers, held_out, settings, folder)
    resumed = trainer.resume()
    console.log(f"resumed at step {trainer.step} ({trainer.seconds / 60:.1f} training min)" if resumed
                else f"fresh draft: {config['num_hidden_layers']} layers, vocabulary {len(ids)} ids")
    with bar(console) as progress:
        report = TrainingReport(progress, folder, fresh=not resumed)
        if not resumed:
            report.record(trainer, trainer.evaluate())
        trainer.run(report)
        if trainer.step % args.eval_every:
            report.record(trainer, trainer.evaluate())
    write_draft(args.out, model, config, ids, answers, target.lm_head_weight)
    console.log(f"wrote {args.out} (held-out tau {report.tau:.3f}, {trainer.step} steps, "
                f"{trainer.seconds / 60:.1f} training min)")


def initial_draft(config: dict, target, seed: int):
    """Seeded random layers whose residual branches start at zero (o_proj, down_proj), and the
    target's final-norm weights on the draft's: at step 0 the draft passes each block row's
    token embedding straight to the target's own head, and training grows the layers from there.
    A DFlash 2 draft starts as that DFlash 1 draft: identity convs, a selector adding nothing."""
    model = random_model(config, seed)
    with torch.no_grad():
        for layer in model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
            for conv in (layer.attention_conv, layer.mlp_conv):
                if conv is not None:
                    identity_(conv)
        model.norm.weight.copy_(target.norm.weight)
        if model.candidate_selector is not None:  # pairwise term 0: the walk starts as the argmax chain
            model.candidate_selector.hidden_projection.weight.zero_()
    return model


def write_draft(out: Path, model, config: dict, ids: list[int], answers, head: torch.Tensor) -> None:
    """draft_vocab.json (exactly the vocabulary trained over) and its vLLM form (rows of the
    target's head `head` [V, H] and d2t) first, weights and config.json last: config.json marks
    a finished draft."""
    out.mkdir(parents=True, exist_ok=True)
    source = f"target greedy picks in its {len(answers)} answers to chat prompts (serving.tools.drafter)"
    (out / "config.json").unlink(missing_ok=True)
    write_vocab(out, ids, pick_counts(answers), source)
    write_tensors(out, ids, head)
    save_draft(model, vllm_config(config, ids), out)


def requests_for(tokenizer, prompts: list[str], sample_every: int, max_new: int, seed: int):
    """Each prompt through the chat template, answered greedily, and every `sample_every`-th
    also sampled (seeded); in prompt order, so a longer list extends a shorter one's."""
    from serving.sampling import SamplingParams

    from .responses import Request

    out = []
    for i, text in enumerate(prompts):
        ids = tokenizer.encode_chat([{"role": "user", "content": text}])
        out.append(Request(ids, SamplingParams(temperature=0.0), max_new))
        if sample_every and i % sample_every == 0:
            out.append(Request(ids, SamplingParams(temperature=0.8, top_p=0.95, seed=seed + i), max_new))
    return out


def answers_for(target, requests, taps, base: str, stop_ids, folder: Path, label: str, console):
    from .responses import cached_answers

    began = time.monotonic()

    def shard_done(done, total):
        console.log(f"{label}: {done}/{total} answers ({time.monotonic() - began:.0f} s)")
    answers = cached_answers(target, requests, taps, base, stop_ids, folder, on_shard=shard_done)
    return [a for a in answers if a.tokens.numel() - a.prompt_len >= 2]  # room for one anchor and a label


def pick_counts(answers) -> Counter:
    """How often the target picks each token over its responses."""
    counts = Counter()
    for a in answers:
        counts.update(a.picks[a.prompt_len - 1:].tolist())
    return counts


def choose_vocab(answers, size: int) -> list[int]:
    """The `size` tokens the target picks most often in its answers (FR-Spec), most frequent first."""
    return most_frequent(pick_counts(answers), size)


def saved_or_new(folder: Path, name: str, make):
    """A JSON value kept in the training folder, so a resumed run uses the same one."""
    path = folder / name
    if path.exists():
        return json.loads(path.read_text())
    value = make()
    path.write_text(json.dumps(value))
    return value


