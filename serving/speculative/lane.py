"""Speculative rounds for every decoding sequence at once, inside the batch runner (serving.engine.batch).

One round for B sequences: the controller for B's batch-size bucket picks the setting (plain
decoding or a verify width); one batched draft pass proposes a block for every sequence that
drafts (serving.speculative.dflash); each sequence's verifier plans its own tree; one
target forward runs all trees packed back to back, each under its own ancestor mask over its
own slice of the KV pool (serving.models.batched.forward; a hybrid verifies each tree through
its own forward in turn); then, per sequence, the walk, KV
compaction and the accepted rows' features queued for its draft context.

Draft K/V: one pool of the target pool's rows over the draft's layers, allocated with the
lane; a sequence's draft context is the same row range as its target reservation (a round's
block fits wherever the target's verify rows fit), so the target pool's free list lends both
and releasing the target's rows frees the draft's.

Rows are ragged, neither padded to the widest tree nor grouped by setting: a sequence near
its max_tokens drafts less, a /health_generate probe's rounds all verify the widest setting,
plain rows are one row, and each costs only its own rows. Speculation pays less as the batch grows (a batch of
plain steps already reads the weights once for B tokens), so the adaptive controller keeps
its measurements per batch-size bucket (1, 2, 3-4, 5-8, ...) and each bucket finds its own
best setting, plain included. Lossless: every committed token is the target's own choice.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from serving.models import batched
from serving.models.packing import row_slices

from .adaptive import Controller, Setting, widths
from .base import Method
from .tree import Trial, Tree, chain_tree, visibility, walk

ABSORB_ROWS = 64  # while plain rounds run, project a sequence's queued features once this many wait


@dataclass
class RoundTimes:
    """Seconds spent per phase, summed over rounds (the benchmark reads these)."""

    rounds: int = 0      # sequence-rounds: a round of B sequences counts B
    accepted: int = 0    # tokens committed by rounds, bonus included
    draft: float = 0.0
    tree: float = 0.0    # tree build (the verifier's plan)
    verify: float = 0.0  # the target forward, masks included
    accept: float = 0.0  # choices, walk, KV compaction, draft context update

    @property
    def tau(self) -> float:
        return self.accepted / self.rounds if self.rounds else 0.0

    def add(self, sequences: int, accepted: int, draft: float, tree: float, verify: float, accept: float) -> None:
        self.rounds, self.accepted = self.rounds + sequences, self.accepted + accepted
        self.draft, self.tree, self.verify, self.accept = (self.draft + draft, self.tree + tree,
                                                           self.verify + verify, self.accept + accept)


def settings(method: Method, adaptive: bool) -> list[Setting]:
    """The method's fixed setting, or (adaptive) plain decoding plus verify widths up to it.

    Tree verifiers vary the node budget (rows = budget + 1), chain verifiers the block length;
    the verifier's own width bounds them (the drafter's block may be wider than a small budget)."""
    rows = method.verifier.needs.draft_tokens
    if method.needs.tree_attention:
        fixed = [Setting(f"budget {b}", b + 1) for b in widths(rows - 1)]
    else:
        fixed = [Setting(f"block {b}", b) for b in widths(rows, 2)]
    return [Setting("plain", 1)] + fixed if adaptive else fixed[-1:]


def draft_depth(block: int, room: int, free: int) -> int:
    """The drafter's whole block whatever the width verified (a width verifies the first rows of
    the tree the whole block makes, so a fixed width and an adaptive one at that width draft the
    same tree), never more than the tokens still wanted (`room`) or the rows left in the
    sequence's reservation (`free`)."""
    return max(0, min(block - 1, room - 1, free - 1))


def drafts_cut(block: int, room: int) -> bool:
    """A request's last tokens (`room` left) keep a round from drafting the whole block."""
    return room < block


def counts_for(context, controller: Controller, forced: bool) -> float:
    """What the widest width's trial drafted on this sequence now counts for in what the server
    says its draft accepts: a forced round's (a probe's) or a fixed setting's once; an adaptive
    one's inside a window, after its burn-in, with the window's weight. A window's first trial
    starts the widest's chain wherever the window opened, and its round would eat the window
    where the draft does well (a window read the draft at 1.5-1.9 tokens a round where budget
    16 realizes 2.6); rounds that start after a burn-in of tokens the content does not choose
    sample it as a fixed run's rounds do (Controller._measure). A sequence's first round starts
    where every fixed run does: each counts, weighed against the windows' rounds by how often
    they are sampled (all of them, against a window's count over its gap), so a short answer,
    whose last drafts are cut, still says what its draft accepts."""
    if forced or controller.fixed:
        return 1.0
    if context.fresh:
        return (controller.trial_window - controller.burn_in) / controller.trial_gap
    if not controller.measuring:
        return 0.0
    if context.window != controller.windows:
        context.window, context.window_tokens = controller.windows, 0
    return controller.window_weight if context.window_tokens >= controller.burn_in else 0.0


def bucket(batch: int) -> int:
    """The smallest power of two >= batch: 1, 2, 4 (3-4), 8 (5-8), ..."""
    return 1 << (batch - 1).bit_length()


def bucket_label(key: int) -> str:
    return str(key) if key <= 2 else f"{key // 2 + 1}-{key}"


class SpecLane:
    def __init__(self, target, method: Method, rows: int, adaptive: bool = False):
        """rows: the target pool's; the draft pool beside it has as many, and each sequence's
        draft context is the same row range as its target reservation."""
        self.target, self.method, self.adaptive = target, method, adaptive
        self.drafter = method.drafter
        self.pool = self.drafter.pool(rows)
        self.layers = method.needs.target_layers
        self.width = self.drafter.feature_width
        self.controllers: dict[int, Controller] = {}
        self.last = self.controller(1)
        self.times = RoundTimes()

    def controller(self, batch: int) -> Controller:
        key = bucket(batch)
        if key not in self.controllers:
            self.controllers[key] = Controller(settings(self.method, self.adaptive))
        return self.controllers[key]

    @property
    def server_args(self) -> dict:
        """Resolved speculative arguments; current setting and measurements of the batch size
        that ran last, and per batch-size bucket."""
        return {"speculative_algorithm": self.method.name.upper(),
                "speculative_num_draft_tokens": self.drafter.needs.draft_tokens,
                "speculative_ddtree_budget": self.method.verifier.budget,
                "speculative_adaptive": self.adaptive,
                "speculative_current_setting": self.last.current.label,
                "speculative_settings": self.last.report(),
                "speculative_settings_by_batch": {bucket_label(k): {"current": c.current.label, "settings": c.report()}
                                                  for k, c in sorted(self.controllers.items())}}

    def admit(self, seq, cache) -> None:
        """cache: the sequence's reservation in the target pool; its draft context takes the same rows."""
        seq.state.draft = self.drafter.context(self.pool, cache.pool_start, cache.capacity)

    def record(self, seq, hidden: torch.Tensor) -> None:
        """Target features hidden [n, >= width] of the sequence's next n committed tokens."""
        self.drafter.extend(seq.state.draft, hidden[:, : self.width])

    def round(self, seqs) -> list[list[int]]:
        """One speculative (or plain) round for every sequence: its committed tokens, bonus last."""
        t0 = time.perf_counter()
        controller = self.last = self.controller(len(seqs))
        probes = [s.request.probe for s in seqs]    # /health_generate: what the draft accepts, verified
        setting = controller.settings[-1] if any(probes) else controller.choose()
        weights = [counts_for(s.state.draft, controller, any(probes)) for s in seqs]
        widest = controller.settings[-1].rows    # the tree planned: every width verifies its first rows
        block = self.drafter.needs.draft_tokens
        # measured unless more than a quarter of the sequences had their drafts cut short by their
        # last tokens (draft_depth's room): one cut sequence in 8 barely moves the round's yield,
        # but requiring none would leave large batches nearly unmeasured
        short = [drafts_cut(block, s.remaining) for s in seqs]
        full = setting.rows == 1 or sum(short) <= len(seqs) // 4
        # a sequence's first round drafts whatever runs: every width's fixed run starts there, so
        # its trial counts, and a short answer still says what its draft accepts
        drafting = setting.rows > 1 or controller.trial or any(s.state.draft.fresh for s in seqs)
        caught = 0.0
        if drafting:   # features queued over plain rounds: owed whatever runs, so not this setting's cost
            self.drafter.absorb([s.state.draft for s in seqs])
            caught = time.perf_counter() - t0
        drafts = self._draft(seqs) if drafting else {}
        t1 = time.perf_counter()
        trees = self._plan(seqs, drafts, widest)
        self._try(seqs, trees, short, controller, weights)
        trees = [tree.prefix(min(setting.rows, s.state.cache.capacity - s.state.cache.length))
                 for s, tree in zip(seqs, trees)]
        t2 = time.perf_counter()
        logits, hidden = self._verify(seqs, trees)
        t3 = time.perf_counter()
        slices = row_slices(len(tree) for tree in trees)
        choices = self._choices(seqs, trees, logits, slices)
        committed = [self._accept(seq, tree, choices[rows], hidden[rows])
                     for seq, tree, rows in zip(seqs, trees, slices)]
        self._score(seqs, committed, widest, setting.rows)
        if setting.rows == 1:
            self.drafter.absorb([s.state.draft for s in seqs if s.state.draft.pending_rows >= ABSORB_ROWS])
        t4 = time.perf_counter()
        controller.record(setting, sum(map(len, committed)), t4 - t0 - caught, full,
                          t1 - t0 - caught if drafts else 0.0, len(seqs))
        self.times.add(len(seqs), sum(map(len, committed)), t1 - t0, t2 - t1, t3 - t2, t4 - t3)
        return committed

    def _draft(self, seqs) -> dict:
        """One draft pass for every sequence that drafts, each its whole block where its request
        has room: {index: draft logits [depth, V']}."""
        block = self.drafter.needs.draft_tokens
        depths = [draft_depth(block, s.remaining, s.state.cache.capacity - s.state.cache.length) for s in seqs]
        drafting = [i for i, d in enumerate(depths) if d]
        for i in drafting:      # the draft context must describe exactly the target's committed tokens
            context, length = seqs[i].state.draft, seqs[i].state.cache.length
            if context.length + context.pending_rows != length:
                raise ValueError(f"draft context holds {context.length + context.pending_rows} positions, "
                                 f"the target {length}")
        proposals = self.drafter.propose([seqs[i].state.draft for i in drafting],
                                         [seqs[i].state.next for i in drafting],
                                         [depths[i] for i in drafting]) if drafting else []
        return dict(zip(drafting, proposals))

    def _plan(self, seqs, drafts: dict, rows: int) -> list[Tree]:
        """Each sequence's tree of up to `rows` rows: its verifier's plan of its draft (a lone
        root if it drafts nothing); a round verifies its setting's first rows of it."""
        plan = self.method.verifier.plan
        return [plan(s.state.next, drafts[i], min(rows, s.state.cache.capacity - s.state.cache.length),
                     self.drafter.vocab) if i in drafts
                else chain_tree(s.state.next, []) for i, s in enumerate(seqs)]

    @staticmethod
    def _try(seqs, trees: list[Tree], cut: list[bool], controller: Controller, weights: list[float]) -> None:
        """A trial of each drafted tree for every width whose last round on its sequence has
        ended, unless its sequence's last tokens cut the draft short; it counts for the widths
        whose last round ended right here (serving.speculative.tree.Trial), and on the sequence
        with its weight (`counts_for`)."""
        rows = [s.rows for s in controller.settings if not s.plain]
        for seq, tree, short, weight in zip(seqs, trees, cut, weights):
            context = seq.state.draft
            due = set(rows).difference(*(t.open for t in context.trials))
            if len(tree) > 1 and due and not short:
                chained = due if context.fresh else context.chained & due
                context.trials.append(Trial(tree, due, controller, chained, weight))
            context.chained, context.fresh = set(), False      # a chain not continued here is broken

    @staticmethod
    def _score(seqs, committed: list[list[int]], widest: int, verified: int) -> None:
        """Follow every running trial along the round's committed tokens; each counted width's
        round that ends is reported to the controller that drafted it, and the widest width's on
        the sequence too (what its draft accepts, whatever its rounds ran). A width's chain goes
        on only where its bonus had to end the round: a plain round's one token, or a round that
        verified that width. Where another width's round happened to end at its bonus, going on
        would pick its next rounds by how this one fared against that width's (a budget-16 draft
        that realizes 2.5 a round read 1.6 behind narrower rounds)."""
        for seq, tokens in zip(seqs, committed):
            context = seq.state.draft
            context.window_tokens += len(tokens)
            for trial in context.trials:
                for rows, accepted, here in trial.feed(tokens):
                    if here and verified in (1, rows):        # its bonus is the next round's root
                        context.chained.add(rows)
                    if rows not in trial.chained:
                        continue
                    trial.owner.observe(rows, accepted)
                    if rows == widest and trial.weight:
                        seq.trials += 1
                        seq.trial_accepted += trial.weight * accepted
                        seq.trial_weight += trial.weight
            context.trials[:] = [t for t in context.trials if not t.done]

    def _verify(self, seqs, trees: list[Tree]):
        """One target forward over every tree: logits [N, vocab], captured features [N, width]."""
        device = self.target.device
        caches = [s.state.cache for s in seqs]
        packed = torch.tensor([[t for tree in trees for t in tree.tokens],
                               [c.length + d for tree, c in zip(trees, caches) for d in tree.depths]],
                              dtype=torch.long, device=device)                  # [2, N]: tokens, positions
        masks = [None if tree.is_chain else visibility(tree, device) for tree in trees]
        return batched.forward(self.target, packed[0], packed[1], caches, [len(t) for t in trees], masks,
                               capture=self.layers)

    @staticmethod
    def _choices(seqs, trees: list[Tree], logits: torch.Tensor, slices: list[slice]) -> list[int]:
        """The target's choice per row, each sequence with its own sampling and draws (keyed by the
        position each row's draw fills); one download for the whole batch."""
        picks = [s.state.draws.choose(logits[rows], s.request.sampling,
                                      [s.state.cache.length + d + 1 for d in tree.depths])
                 for s, tree, rows in zip(seqs, trees, slices)]
        return torch.cat(picks).tolist()

    def _accept(self, seq, tree: Tree, choices: list[int], hidden: torch.Tensor) -> list[int]:
        """Walk the sequence's tree with its choices; keep the path's KV and features."""
        cache = seq.state.cache
        path, bonus = walk(tree, choices)
        if path[-1] == len(path) - 1:                                          # rows 0..k: already in place
            cache.commit(len(path))
            kept = hidden[: len(path)]
        else:
            rows = torch.tensor(path, device=hidden.device)   # one upload for the KV move and the features
            cache.keep(rows)
            kept = hidden[rows]
        self.record(seq, kept)
        seq.state.next = bonus
        return [tree.tokens[i] for i in path[1:]] + [bonus]
