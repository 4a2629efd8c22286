"""A reduced draft vocabulary (FR-Spec): the tokens the target itself outputs most often.

    python -m serving.tools.draft_vocab --target DIR --draft DIR [--size 8192]

Counts the target's own choices: its greedy pick after every position of a standard-library
source corpus, and its greedy answers to chat-templated questions. Writes the `size` most
frequent ids to DRAFT/draft_vocab.json; the drafter then proposes only those (its LM head
shrinks from the full vocabulary to `size` rows) while the target still verifies every
token, so output is unchanged. Deterministic. Also rewrites the draft's vLLM form of the same
vocabulary (serving.tools.vllm_draft: d2t, the head rows, config draft_vocab_size).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from pathlib import Path

import torch

from serving.speculative.dflash import DRAFT_VOCAB


def corpus_picks(target, ids: list[int], chunk: int = 256) -> Counter:
    """Target argmax after each position of `ids`, chunk by chunk (teacher-forced)."""
    counts: Counter = Counter()
    for begin in range(0, len(ids) - 1, chunk):
        part = torch.tensor(ids[begin:begin + chunk])
        logits, _ = target.forward(part, torch.arange(part.numel()), target.new_cache(part.numel()))
        counts.update(logits.argmax(-1).tolist())
    return counts


def answer_picks(target, tokenizer, questions, length: int) -> Counter:
    """Tokens of the target's greedy answers to each question through its chat template."""
    from serving.sampling import SamplingParams
    from serving.tools.train_draft import continuation

    counts: Counter = Counter()
    for question in questions:
        prompt = tokenizer.encode_chat([{"role": "user", "content": question}])
        counts.update(continuation(target, prompt, SamplingParams(temperature=0.0), length, 0))
    return counts


def most_frequent(counts: Counter, size: int) -> list[int]:
    """The `size` most counted token ids, most frequent first (ties: lower id first)."""
    return [t for t, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))][:size]


def write_vocab(draft: Path, ids: list[int], counts: Counter, source: str) -> None:
    """DRAFT/draft_vocab.json: `ids` in order, with the share of `counts` they cover."""
    coverage = sum(counts[t] for t in ids) / max(1, sum(counts.values()))
    (draft / DRAFT_VOCAB).write_text(json.dumps({"source": source, "coverage": round(coverage, 4),
                                                 "token_ids": ids}))


def main(argv=None) -> int:
    from serving.models.tokenizer import Tokenizer
    from serving.tools.train_draft import CACHE, CHAT_QUESTIONS, load_target, stdlib_sources
    from serving.tools.vllm_draft import VLLM_FILE, VLLM_KEY, export

    ap = argparse.ArgumentParser(prog="python -m serving.tools.draft_vocab", description=__doc__.splitlines()[0])
    ap.add_argument("--target", type=Path, default=CACHE / "models/smollm2-135m-instruct")
    # no default: `make drafter` writes the vocabulary its head was trained over, and a
    # different one here would leave that head proposing from the wrong rows
    ap.add_argument("--draft", type=Path, required=True)
    ap.add_argument("--size", type=int, default=8192)
    ap.add_argument("--corpus-chars", type=int, default=200_000)
    ap.add_argument("--answer-tokens", type=int, default=48)
    args = ap.parse_args(argv)
    if not (args.draft / "config.json").is_file():
        ap.error(f"{args.draft / 'config.json'}: no draft there (its vocabulary goes beside a written draft)")
    torch.set_num_threads(1)
    began = time.monotonic()
    target = load_target(args.target, positions=512)
    tokenizer = Tokenizer.from_dir(args.target)
    counts = corpus_picks(target, tokenizer.encode(stdlib_sources(args.corpus_chars), prompt=False))
    counts += answer_picks(target, tokenizer, CHAT_QUESTIONS, args.answer_tokens)
    source = (f"target greedy picks over {args.corpus_chars} chars of stdlib source and its answers "
              f"to {len(CHAT_QUESTIONS)} chat questions")
    ids = most_frequent(counts, args.size)
    write_vocab(args.draft, ids, counts, source)
    export(args.draft, ids, target.lm_head_weight)  # vLLM reads the same vocabulary as d2t
    print(f"wrote {len(ids)} ids ({len(counts)} distinct seen) to {args.draft / DRAFT_VOCAB} "
          f"and its vLLM form ({VLLM_FILE}, config {VLLM_KEY}) in {time.monotonic() - began:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
