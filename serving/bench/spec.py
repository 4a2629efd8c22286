"""Speculative decoding benchmark: every method on the same prompts, in one process.

Pure where it can be: method specs parse to `BenchMethod`, runs reduce to `MethodResult`;
the torch work is in `run_methods`. Figures: tokens/s, speedup over `none` measured in
the same run, tau (tokens committed per verify round, bonus included), time per round
split into draft / tree build (+ mask) / verify / accept (+ KV compaction), and whether
every output equals the `none` output token for token. Hybrid targets add the state handling
share: planning the tree for the linear-attention layers (parents, levels, conv windows) plus
committing the accepted row's conv and recurrent state (prefill chunks' commits included), over
the measured round time. Each method runs in the engine's batch runner, one request at a time.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field

from serving.engine import StopRule, run_alone
from serving.engine.build import runner_factory
from serving.sampling import SamplingParams
from serving.speculative import MethodSpec, SpecOptions, resolve

PHASES = ("draft", "tree", "verify", "accept")


@dataclass(frozen=True)
class BenchMethod:
    label: str  # as given, e.g. "ddtree:64" or "ddtree:64+adaptive"
    spec: MethodSpec
    budget: int | None = None
    adaptive: bool = False  # the runtime's adaptive controller, settings up to the budget/block
    draft_vocab: bool = True  # the draft's reduced vocabulary (draft_vocab.json) when it has one


SUFFIXES = ("adaptive", "full-vocab")


def parse_methods(text: str) -> list[BenchMethod]:
    """'none,dflash,ddtree:16,ddtree:64+adaptive,ddtree:16+full-vocab' -> methods; a budget only
    where the method takes one; +adaptive: the adaptive controller; +full-vocab: ignore the
    draft's reduced vocabulary."""
    out = []
    for item in filter(None, (s.strip() for s in text.split(","))):
        method, *suffixes = item.split("+")
        unknown = [s for s in suffixes if s not in SUFFIXES]
        if unknown:
            raise ValueError(f"--methods {item}: unknown suffix +{unknown[0]} (choose from +{', +'.join(SUFFIXES)})")
        name, _, budget = method.partition(":")
        spec = resolve(name)
        if budget and not spec.takes_budget:
            raise ValueError(f"--methods {item}: {name} takes no tree budget")
        if suffixes and not spec.speculative:
            raise ValueError(f"--methods {item}: plain decoding has nothing to adapt or draft")
        out.append(BenchMethod(item, spec, int(budget) if budget else None, adaptive="adaptive" in suffixes,
                               draft_vocab="full-vocab" not in suffixes))
    if not out:
        raise ValueError("--methods: no method given")
    return out


@dataclass
class MethodResult:
    label: str
    speculative: bool = False
    tokens: int = 0
    seconds: float = 0.0
    rounds: int = 0
    accepted: int = 0
    phase_seconds: dict = field(default_factory=lambda: dict.fromkeys(PHASES, 0.0))
    outputs: list = field(default_factory=list)
    speedup: float = 1.0
    equal_to_none: bool | None = None
    state_seconds: float | None = None   # hybrid targets: linear-attention state handling in rounds
    settings: list = field(default_factory=list)  # per setting: rounds, tokens/round, tokens/s
    choice: str = ""  # the setting an adaptive run ended on

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0

    @property
    def tau(self) -> float:
        return self.accepted / self.rounds if self.rounds else 1.0

    def per_round_ms(self) -> dict:
        return {p: 1000 * s / self.rounds if self.rounds else 0.0 for p, s in self.phase_seconds.items()}

    @property
    def overhead_share(self) -> float:
        """Tree build + mask + accept/compaction as a share of the measured round time."""
        total = sum(self.phase_seconds.values())
        return (self.phase_seconds["tree"] + self.phase_seconds["accept"]) / total if total else 0.0

    @property
    def state_share(self) -> float | None:
        """Hybrid state handling as a share of the measured round time (None: no linear layers)."""
        total = sum(self.phase_seconds.values())
        return self.state_seconds / total if self.state_seconds is not None and total else None

    def summary(self) -> dict:
        out = {k: v for k, v in asdict(self).items() if k != "outputs"}
        out.update(tokens_per_s=self.tokens_per_s, tau=self.tau, ms_per_round=self.per_round_ms(),
                   overhead_share=self.overhead_share, state_share=self.state_share)
        return out


def compare(results: list[MethodResult]) -> None:
    """Speedup and output equality against the first `none` run (in place)."""
    base = next((r for r in results if not r.speculative), results[0])
    for r in results:
        r.speedup = r.tokens_per_s / base.tokens_per_s if base.tokens_per_s else 0.0
        r.equal_to_none = r.outputs == base.outputs


def generate(runner, prompt: list[int], max_tokens: int, stop_ids: frozenset) -> tuple[list[int], float]:
    """Greedy tokens up to max_tokens or the first stop id (kept), as the engine truncates,
    and the seconds spent on hybrid state handling."""
    before = runner.pool.state_seconds
    done = run_alone(runner, prompt, SamplingParams(temperature=0), StopRule(max_tokens, stop_ids=stop_ids))
    return list(done.token_ids), runner.pool.state_seconds - before


@dataclass
class Run:
    """One method's runner and the result its prompts add up to."""

    runner: object
    result: MethodResult
    before: dict | None  # the runner's round times after warm-up


def prepare(method: BenchMethod, target, draft: str | None, prompts: list[list[int]], stop_ids: frozenset,
            capacity: int) -> Run:
    options = SpecOptions(draft_path=draft if method.spec.speculative else None, budget=method.budget,
                          adaptive=method.adaptive, draft_vocab=method.draft_vocab)
    runner = runner_factory(target, capacity, method.spec, options, prefix_cache=False)()
    generate(runner, prompts[0][:16], 8, stop_ids)  # warm-up: allocator, kernels
    result = MethodResult(method.label, speculative=method.spec.speculative)
    if target.config.linear_layers:
        result.state_seconds = 0.0
    return Run(runner, result, dict(vars(runner.spec.times)) if runner.spec else None)


def run_prompt(run: Run, prompt: list[int], max_tokens: int, stop_ids: frozenset) -> None:
    result = run.result
    began = time.perf_counter()
    out, state = generate(run.runner, prompt, max_tokens, stop_ids)
    result.seconds += time.perf_counter() - began
    result.tokens += len(out)
    result.outputs.append(out)
    if result.state_seconds is not None:
        result.state_seconds += state


def finish(run: Run, prompts: int) -> MethodResult:
    result, spec = run.result, run.runner.spec
    report = run.runner.server_args
    result.settings, result.choice = report.get("speculative_settings", []), report.get("speculative_current_setting", "")
    if spec is not None:
        times = spec.times
        result.rounds = times.rounds - run.before["rounds"]
        result.accepted = times.accepted - run.before["accepted"]
        result.phase_seconds = {p: getattr(times, p) - run.before[p] for p in PHASES}
    else:  # plain decoding: one token per round after each prompt's first
        result.rounds = result.accepted = result.tokens - prompts
        result.phase_seconds["verify"] = result.seconds
    return result


def run_methods(methods: list[BenchMethod], target, draft: str | None, prompts: list[list[int]],
                max_tokens: int, stop_ids: frozenset, capacity: int, repeat: int = 1) -> list[MethodResult]:
    """Every method on every prompt, `repeat` times, interleaved: prompt by prompt, each method
    in turn, so a slow moment of a shared machine falls on all of them alike. The turn rotates
    from prompt to prompt (the first method of prompt k is method k), because on a shared CPU the
    place in the turn alone moved a method by up to 8 % (three `none` runs in one turn). Each
    method keeps its runner (and an adaptive controller what it learned) from prompt to prompt."""
    runs = [prepare(m, target, draft, prompts, stop_ids, capacity) for m in methods]
    turn = 0
    for _ in range(repeat):
        for prompt in prompts:
            for run in runs[turn % len(runs):] + runs[: turn % len(runs)]:
                run_prompt(run, prompt, max_tokens, stop_ids)
            turn += 1
    return [finish(run, len(prompts) * repeat) for run in runs]
