"""Accepted length of a trained drafter's proposals on the held-out answers, by proposal rule.

    python -m serving.tools.drafter.trees --draft DIR [--budgets 4,8,16] [--target DIR]

At every response position of the held-out (greedy) answers, one round is simulated from the
draft's block there: the chain of argmaxes, the selector's greedy chain (DFlash 2 drafts), and at
each budget the DDTree the tree verifier plans from the per-row marginals (heap over the draft's
logits) and, for a selector draft, from its pairwise scores (each child scored given its
parent's token: `Candidates.tree`), and the selector's ceiling (rounds end only where the
answer's token is not among the row's candidates). On a greedy answer the target's choice after an accepted
prefix is the answer's next token, so a round accepts the longest answer prefix the tree holds,
plus the bonus. Both trees have the same node budget; the figures are mean tokens per round.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from serving.speculative.chain import ChainVerifier
from serving.speculative.ddtree import TreeVerifier
from serving.speculative.tree import walk

from .objective import draft_rows, response_anchors


def accepted(tree, picks: torch.Tensor, start: int) -> int:
    """Tokens a round at `start` commits: row r's target choice is the answer's pick after its depth."""
    n = picks.numel()   # past the answer's end there is no target choice: -1 matches no token
    choices = [int(picks[start + d]) if start + d < n else -1 for d in tree.depths]
    path, _ = walk(tree, choices)
    return len(path)   # accepted rows after the root, plus the bonus


def ceiling(candidates, picks: torch.Tensor, start: int) -> int:
    """Tokens a round would commit under a perfect selector: while the answer's next token is
    among the row's candidates (what no walk over them can exceed), plus the bonus."""
    n, rows = picks.numel(), candidates.tokens.tolist()
    run = 0
    for d, row in enumerate(rows):
        if start + d >= n or int(picks[start + d]) not in row:
            break
        run += 1
    return run + 1


def rounds(model, target, head, vocab, answers, budgets: list[int]) -> dict[str, float]:
    """Mean tokens per round for each proposal rule over every response position."""
    totals: dict[str, int] = {}
    count = 0
    selector = model.candidate_selector
    chain = ChainVerifier(model.cfg.block_size)
    with torch.no_grad():
        for answer in answers:
            for part in response_anchors(answer).split(64):
                hidden, logits = draft_rows(model, target, head, answer, part)
                for h, z, s in zip(hidden, logits, part.tolist()):
                    bonus = int(answer.tokens[s])
                    rules = {"argmax chain": chain.plan(bonus, z, model.cfg.block_size, vocab)}
                    candidates = selector.candidates(h, z, answer.tokens[s], vocab) if selector else None
                    if candidates is not None:
                        rules["selector chain"] = chain.plan(bonus, candidates, model.cfg.block_size)
                    for b in budgets:
                        rules[f"marginal tree {b}"] = TreeVerifier(b).plan(bonus, z, b + 1, vocab)
                        if candidates is not None:
                            rules[f"pairwise tree {b}"] = TreeVerifier(b).plan(bonus, candidates, b + 1)
                    for name, tree in rules.items():
                        totals[name] = totals.get(name, 0) + accepted(tree, answer.picks, s)
                    if candidates is not None:
                        name = f"top-{candidates.tokens.shape[1]} ceiling"
                        totals[name] = totals.get(name, 0) + ceiling(candidates, answer.picks, s)
                    count += 1
    return {name: total / count for name, total in totals.items()}


def main(argv=None) -> int:
    from rich.console import Console

    from serving.speculative.dflash import load_model, load_vocab

    from .__main__ import CACHE, parse
    from .run import gather

    ap = argparse.ArgumentParser(prog="python -m serving.tools.drafter.trees", description=__doc__.splitlines()[0])
    ap.add_argument("--draft", type=Path, required=True, help="a drafter's output folder")
    ap.add_argument("--target", type=Path, default=CACHE / "models/smollm2-135m-instruct")
    ap.add_argument("--budgets", default="4,8,16", help="tree node budgets")
    ap.add_argument("--training", type=int, default=0, help="measure on the first N training answers instead")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    console = Console(stderr=True)
    model = load_model(args.draft, torch.float32, "cpu")
    config = {"dflash_config": {"target_layer_ids": list(model.cfg.target_layer_ids)}}
    target, trained_on, held_out = gather(parse(["--target", str(args.target), "--block", str(model.cfg.block_size)]),
                                 config, console)
    ids = load_vocab(args.draft, target.config.vocab_size)
    vocab = torch.tensor(ids) if ids else torch.arange(target.config.vocab_size)
    head = target.lm_head_weight[vocab].contiguous()
    budgets = [int(b) for b in args.budgets.split(",")]
    answers, label = (trained_on[: args.training], "training") if args.training else (held_out, "held-out")
    figures = rounds(model, target, head, vocab, answers, budgets)
    print(f"{args.draft.name}: tokens per round over {len(answers)} {label} answers")
    for name, tau in figures.items():
        print(f"  {name:<20} {tau:.3f}")
    for b in budgets:
        if f"pairwise tree {b}" in figures:
            print(f"  pairwise / marginal at budget {b}: {figures[f'pairwise tree {b}'] / figures[f'marginal tree {b}']:.3f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
