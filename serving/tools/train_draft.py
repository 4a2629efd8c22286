"""Block training for DFlash drafters: the primitives the tiny drafts' distillation
(`serving.tools.tiny_draft`) and the SmolLM2 drafter (`serving.tools.drafter`, `make drafter`,
the one command that trains it) share, plus offline text (this Python's standard-library
sources, chat questions) for them and `serving.tools.draft_vocab`. Labels are the target's own
greedy choices, so a draft learns to predict what the verifier will accept.

Each training example is a block at an anchor s: ids [tok_s, MASK x (B-1)] at positions
s..s+B-1, context = target features of positions < s, labels = the target's picks for
positions s+1..s+B-1. Later positions weigh less (exp decay), as in DFlash training.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import torch
import torch.nn.functional as F

from serving.speculative.draft_model import DFlashDraftModel, attend_after, visible

CACHE = Path(os.environ.get("DDOPS_CACHE", "/var/cache/ddops"))


def load_target(path: Path, positions: int = 2048):
    from serving.models import inspect_checkpoint, load_model

    target = load_model(inspect_checkpoint(path), torch.float32, "cpu", positions)
    return target.requires_grad_(False)


def features_and_labels(target, tokens: list[int], taps: tuple[int, ...]):
    """Target features [S, taps*H] and picks [S] (argmax after each position), as normal tensors."""
    ids = torch.tensor(tokens)
    cache = target.new_cache(len(tokens))
    logits, hidden = target.forward(ids, torch.arange(len(tokens)), cache, capture=taps)
    return hidden.clone(), logits.argmax(-1).clone()


def example(target, text: list[int], taps: tuple[int, ...]) -> tuple:
    """(tokens [S], feats [S, taps*H], picks [S]): one training sequence."""
    feats, picks = features_and_labels(target, text, taps)
    return torch.tensor(text), feats, picks


def block_hidden(model: DFlashDraftModel, target, tokens: torch.Tensor, feats: torch.Tensor,
                 anchors: torch.Tensor) -> torch.Tensor:
    """Final draft hidden [m, B-1, H] of m blocks at `anchors` [m] of one sequence (tokens [S]),
    all in one batch: block b sees context rows < anchors[b] and its own block."""
    cfg, block, m = model.cfg, model.cfg.block_size, anchors.numel()
    x_pos = anchors[:, None] + torch.arange(block)  # [m, B]
    ids = torch.full((m, block), cfg.mask_token_id)
    ids[:, 0] = tokens[anchors]
    x = model.noise(target, ids)  # [m, B, H]
    ctx_pos = torch.arange(feats.shape[0])
    ctx = model.project(feats[None])  # [1, S, H]
    ctx_rot, x_rot = model.rotary(ctx_pos), model.rotary(x_pos)  # cos, sin [S, hd] and [m, B, hd]
    seen = (ctx_pos[None, :] < anchors[:, None])[:, None, :].expand(m, block, -1)  # [m, B, S]
    for i, layer in enumerate(model.layers):
        k, v = layer.context_kv(ctx, *ctx_rot)
        k, v = k.expand(m, -1, -1, -1), v.expand(m, -1, -1, -1)
        rule_ctx = visible(x_pos, ctx_pos.expand(m, -1), cfg.causal[i], cfg.window[i])
        rule_blk = visible(x_pos, x_pos, cfg.causal[i], cfg.window[i])
        ctx_ok = seen & rule_ctx if rule_ctx is not None else seen
        blk_ok = rule_blk if rule_blk is not None else torch.ones(m, block, block, dtype=torch.bool)

        def store(kb, vb, k=k, v=v):
            return torch.cat([k, kb], 2), torch.cat([v, vb], 2)
        x = layer(x, *x_rot, attend_after(store, torch.cat([ctx_ok, blk_ok], -1)[:, None]))
    return model.norm(x[:, 1:])


def block_loss(model: DFlashDraftModel, target, tokens: torch.Tensor, feats: torch.Tensor,
               picks: torch.Tensor, anchors: torch.Tensor, negatives: int = 0,
               gen: torch.Generator | None = None) -> torch.Tensor:
    """Weighted cross-entropy against the target's picks (later depths weigh less).

    negatives > 0: sampled softmax over the labels plus that many uniformly drawn tokens
    (the lm_head is most of a step's cost on a large vocabulary; fresh negatives each step
    still push every token down over a run).
    """
    block, m = model.cfg.block_size, anchors.numel()
    labels = picks[anchors[:, None] + torch.arange(block - 1)]  # [m, B-1] pick after s+k-1 = token at s+k
    if negatives:
        weight = target.lm_head_weight
        drawn = torch.randint(weight.shape[0], (negatives,), generator=gen)
        vocab, labels = torch.unique(torch.cat([labels.flatten(), drawn]), return_inverse=True)
        labels = labels[: m * (block - 1)].view(m, block - 1)
        hidden = block_hidden(model, target, tokens, feats, anchors)
        logits = F.linear(hidden, weight[vocab]).float()  # [m, B-1, |candidates|]
    else:
        logits = target.lm_head(block_hidden(model, target, tokens, feats, anchors))  # [m, B-1, V]
    ce = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), reduction="none").view(m, block - 1)
    decay = depth_weights(block)
    return (ce * decay).sum() / (decay.sum() * m)


def depth_weights(block: int) -> torch.Tensor:
    """[B-1] loss weight per depth: later positions weigh less (exp decay), as in DFlash training."""
    return torch.exp(-torch.arange(block - 1, dtype=torch.float32) / max((block - 1) / 2, 1.0))


def train(model: DFlashDraftModel, target, examples: list, steps: int, seed: int, lr: float = 3e-3,
          anchors_per_step: int = 16, negatives: int = 0) -> DFlashDraftModel:
    """examples: (tokens [S], feats [S, F], picks [S]) per sequence; S > block_size."""
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0, betas=(0.9, 0.95))
    block = model.cfg.block_size
    model.train()
    for step in range(steps):
        scale = min(1.0, (step + 1) / 20) * 0.5 * (1 + math.cos(math.pi * step / steps))
        for group in opt.param_groups:
            group["lr"] = lr * scale
        tokens, feats, picks = examples[int(torch.randint(len(examples), (1,), generator=gen))]
        hi = tokens.numel() - block
        anchors = torch.randint(1, hi + 1, (anchors_per_step,), generator=gen)
        loss = block_loss(model, target, tokens, feats, picks, anchors, negatives, gen)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
    return model.eval()


# Generic user turns for chat-shaped distillation contexts. Servers are smoke-tested with chat
# requests; a draft never shown a chat template's framing predicts nothing there. The list
# leaves out the deploy gate's smoke question, so a passing gate shows generalisation.
CHAT_QUESTIONS = (
    "Hello, who are you?", "What is the weather like today?", "Tell me a short story.",
    "How do I sort a list in Python?", "What is two plus two?", "Explain speculative decoding.",
    "Write a haiku about the sea.", "What time is it in Tokyo?", "Name three primary colours.",
    "Why is the sky blue?", "What is the largest planet?", "How far away is the moon?",
    "Give me a recipe for pancakes.", "Translate 'good morning' into Spanish.",
    "Which river runs through Cairo?", "Summarise the plot of Hamlet.", "How does a server work?",
    "Can you count to ten?", "What is a prime number?", "Recommend a good book.",
    "What does a compiler do?", "Who painted the Mona Lisa?", "How many days are in a year?",
    "What is the speed of light?", "Describe a cat.", "Tell me a joke.", "What is 3.14159?",
    "How do trees grow?", "What is the quick brown fox?", "Write a function that adds numbers.",
    "Where is Madrid?", "What should I eat for dinner?",
)


def own_text(target, vocab: int, count: int, length: int, seed: int) -> list[list[int]]:
    """Continuations by the target itself: greedy after each token id in turn (3 in 4, so
    every id is seen), sampled after random prompts (1 in 4)."""
    from serving.sampling import SamplingParams

    gen = torch.Generator().manual_seed(seed)
    order = torch.randperm(vocab, generator=gen).tolist()
    texts = []
    for i in range(count):
        sampled = i % 4 == 3
        prompt = torch.randint(0, vocab, (4,), generator=gen).tolist() if sampled else [order[i % vocab]] * 2
        sampling = SamplingParams(temperature=1.0 if sampled else 0.0, seed=seed + i)
        texts.append(prompt + continuation(target, prompt, sampling, length, seed))
    return texts


def chat_text(target, tokenizer, length: int, seed: int) -> list[list[int]]:
    """Chat-shaped contexts: each of CHAT_QUESTIONS through the target's chat template,
    then the target's greedy answer of `length` tokens (what a chat request verifies)."""
    from serving.sampling import SamplingParams

    texts = []
    for question in CHAT_QUESTIONS:
        prompt = tokenizer.encode_chat([{"role": "user", "content": question}])
        texts.append(prompt + continuation(target, prompt, SamplingParams(temperature=0.0), length, seed))
    return texts


def continuation(target, prompt: list[int], sampling, length: int, seed: int) -> list[int]:
    """The target's own `length` next tokens after `prompt` (plain decoding)."""
    from serving.engine import StopRule, run_alone
    from serving.engine.batch import BatchRunner

    runner = BatchRunner(target, capacity=len(prompt) + length + 8, seed=seed, prefix_cache=False)
    return list(run_alone(runner, prompt, sampling, StopRule(length)).token_ids)


def distill_on_own_text(model: DFlashDraftModel, target_dir: Path, steps: int = 1600, seed: int = 0,
                        count: int = 256, length: int = 24, chat_length: int = 32) -> DFlashDraftModel:
    """Tiny targets: train the draft on the target's own text and picks (under a minute on one core):
    continuations of short token prompts, and answers to chat-templated questions when the
    target has a tokenizer (chat_length covers a 16-token answer plus a block)."""
    from serving.models.tokenizer import Tokenizer

    target = load_target(Path(target_dir), positions=1024)
    taps, vocab = model.cfg.target_layer_ids, target.config.vocab_size
    examples = [example(target, text, taps) for text in own_text(target, vocab, count, length, seed)]
    if (Path(target_dir) / "tokenizer.json").is_file():
        chats = [example(target, text, taps)
                 for text in chat_text(target, Tokenizer.from_dir(target_dir), chat_length, seed)]
        examples += chats * max(1, count // (4 * len(chats)))  # ~1 in 5 training blocks is chat-shaped
    return train(model, target, examples, steps, seed, lr=3e-3, anchors_per_step=32)


def stdlib_sources(limit_chars: int) -> str:
    """Concatenated standard-library sources, in a fixed order (deterministic corpus)."""
    root = Path(os.__file__).parent
    parts, total = [], 0
    for file in sorted(root.glob("*.py")):
        text = file.read_text(errors="replace")
        parts.append(text)
        total += len(text)
        if total >= limit_chars:
            break
    return "\n".join(parts)[:limit_chars]
