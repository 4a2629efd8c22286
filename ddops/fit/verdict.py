"""From pool sizes to a verdict: fits or not, why in plain words, and what to change. Pure.

Reasons follow the order SGLang fails in: weights at load, then the KV budget after the
weights ("Loaded weights leave no GPU memory..."), then the hybrid state ("Not enough GPU memory
for hybrid state cache"), then a pool too small for one context-length request (SGLang starts
and silently caps prompts), then headroom below its reserve (CUDA OOM in graph capture).
Suggestions are re-planned, not guessed: each one is checked to fit before it is offered.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ddops.fit.gpus import GIB
from ddops.fit.memory import Pools, Setup, plan
from ddops.fit.model import ModelFacts

MAX_TP = 8


@dataclass(frozen=True)
class Verdict:
    fits: bool
    headline: str
    reasons: tuple[str, ...]  # why it does not fit (empty when it fits)
    warnings: tuple[str, ...]  # fits, but worth knowing
    suggestions: tuple[str, ...]


@dataclass(frozen=True)
class Assessment:
    setup: Setup
    pools: Pools
    verdict: Verdict

    @property
    def one_request_fits(self) -> bool:
        return self.pools.one_request_fits

    @property
    def full_length_requests(self) -> int:
        return self.pools.full_length_requests


def gib(n: float) -> str:
    """Bytes for people: GiB, or MiB below one GiB."""
    return f"{n / GIB:.1f} GiB" if abs(n) >= GIB else f"{n / (1 << 20):.0f} MiB"


def assess(setup: Setup, target: ModelFacts, draft: ModelFacts | None = None) -> Assessment:
    pools = plan(setup, target, draft)
    reasons = problems(setup, pools)
    suggestions = () if not reasons else tuple(_suggest(setup, pools, target, draft))
    if reasons:
        headline = f"does not fit {_where(setup)}"
    else:
        headline = (f"fits {_where(setup)}: KV pool {pools.kv_tokens:,} tokens, "
                    f"{pools.full_length_requests} full-length request(s) at once")
    warnings = () if reasons else tuple(_warnings(setup, pools))
    return Assessment(setup, pools, Verdict(not reasons, headline, tuple(reasons), warnings, suggestions))


def fits(setup: Setup, target: ModelFacts, draft: ModelFacts | None) -> bool:
    return not problems(setup, plan(setup, target, draft))


def problems(s: Setup, p: Pools) -> list[str]:
    if p.weights >= p.pre:
        split = f" split over {s.tp} GPUs" if s.tp > 1 else ""
        draft = f" + draft {gib(p.draft_weights)}" if p.draft_weights else ""
        return [f"weights alone need {gib(p.weights)} per GPU (target {gib(p.target_weights)}{draft}"
                f"{split}) and a {s.gpu.name} has {gib(p.pre)} usable: no mem-fraction-static fits"]
    found = []
    if p.rest - p.token_table <= 0:
        found.append(f"at mem-fraction-static {p.fraction:.3f} the static share is {gib(p.pre * p.fraction)} "
                     f"but the weights take {gib(p.weights)}: SGLang stops with \"Loaded weights leave no "
                     f"GPU memory for the KV cache\" (minimum viable {p.min_viable:.3f})")
    elif p.mamba_slot and p.mamba_slots < p.slots_per_request:
        found.append(f"the hybrid (linear-attention) state needs {gib(p.mamba_slot)} per request slot plus "
                     f"{gib(p.mamba_spec)} of speculative verify states, more than its share of "
                     f"{gib(p.mamba_bytes)}: SGLang stops with \"Not enough GPU memory for hybrid "
                     f"(mamba/linear-attention) state cache\"")
    elif not p.one_request_fits:
        cap = " (capped by --max-total-tokens)" if p.kv_tokens == s.max_total_tokens else ""
        found.append(f"the KV pool holds {p.kv_tokens:,} tokens{cap}, fewer than one request of "
                     f"context-length {s.context_length:,}: SGLang starts but rejects long prompts")
    # A GPU's memory outside the static share is all its activations and graphs get; a CPU host's
    # RAM is shared with the OS and its page cache, and SGLang's own default fraction there leaves
    # less than its reserve (0.846 of a 23.5 GiB node, measured): not a failure on a CPU.
    if p.headroom < p.reserve and s.available is None:
        found.append(f"headroom (1 - {p.fraction:.3f}) x {gib(p.pre)} = {gib(p.headroom)} is below the "
                     f"{gib(p.reserve)} SGLang reserves for activations and CUDA graphs: expect CUDA out "
                     f"of memory in graph capture or under load (highest working fraction {p.window[1]:.3f})")
    return found


def _warnings(s: Setup, p: Pools) -> list[str]:
    found = []
    if s.max_running_requests and p.full_length_requests < s.max_running_requests and p.kv_tokens:
        found.append(f"only {p.full_length_requests} full-length request(s) fit at once "
                     f"(max-running-requests {s.max_running_requests}); shorter ones share the pool")
    if p.fraction_is_default:
        found.append(f"mem-fraction-static not set: SGLang picks {p.fraction:.3f} from its reserve heuristic")
    return found


def _where(s: Setup) -> str:
    return f"{s.tp} x {s.gpu.name}" + (f" at mem-fraction-static {s.fraction}" if s.fraction else "")


def _suggest(s: Setup, p: Pools, target: ModelFacts, draft: ModelFacts | None) -> list[str]:
    ideas = []
    if s.max_total_tokens and s.max_total_tokens < s.context_length:
        return [f"raise --max-total-tokens in sglang.extra_args to at least {s.context_length:,}, "
                f"or lower memory.context_length to {s.max_total_tokens:,}"]
    low, high = p.window
    if p.weights < p.pre and low <= high:
        pick = round(min(high, max(low + 0.01, (low + high) / 2)), 2)
        pick = pick if low <= pick <= high else high
        ideas.append(f"set memory.mem_fraction_static to {pick} (works from {low:.3f} to {high:.3f})")
        return ideas
    for label, changed in _variants(s):
        window = plan(changed, target, draft).window
        if p.weights < p.pre and window[0] <= window[1]:
            ideas.append(f"{label}, then mem_fraction_static {window[0]:.3f}-{window[1]:.3f} works")
            if changed.max_running_requests != s.max_running_requests:
                break  # the largest request count that works is the one worth offering
    context = _longest_context(s, target, draft)
    if context:
        ideas.append(f"lower memory.context_length to {context:,} or less")
    more = next((tp for tp in (2, 4, MAX_TP) if tp > s.tp and _fits_somewhere(replace(s, tp=tp), target, draft)),
                None)
    if more:
        ideas.append(f"use more GPUs: model.tp_size {more} fits")
    return ideas or ["no single change fits: a larger GPU, a smaller model or quantized weights"]


def _variants(s: Setup) -> list[tuple[str, Setup]]:
    found = []
    if s.cuda_graphs:
        found.append(("turn CUDA graphs off (cuda_graph.enabled: false)", replace(s, cuda_graphs=False)))
    if s.kv_dtype not in ("fp8_e4m3", "fp8_e5m2"):
        found.append(("use memory.kv_cache_dtype fp8_e4m3 (half the KV bytes)", replace(s, kv_dtype="fp8_e4m3")))
    if s.ssm_dtype != "bfloat16" and s.verify_tokens:
        found.append(("use mamba.ssm_dtype bfloat16 (half the hybrid state)", replace(s, ssm_dtype="bfloat16")))
    running = s.max_running_requests or 0
    while running > 1:  # hybrid verify states grow with every running request
        running //= 2
        found.append((f"lower memory.max_running_requests to {running}",
                      replace(s, max_running_requests=running)))
    return found


def _fits_somewhere(s: Setup, target: ModelFacts, draft: ModelFacts | None) -> bool:
    low, high = plan(s, target, draft).window
    return low <= high


def _longest_context(s: Setup, target: ModelFacts, draft: ModelFacts | None) -> int:
    """Longest context (a multiple of 1024) that fits at the highest working fraction, or 0."""
    high = plan(s, target, draft).window[1]
    if high <= 0:
        return 0
    probe = plan(replace(s, fraction=high), target, draft)
    context = (min(probe.kv_tokens, s.context_length - 1) // 1024) * 1024
    while context >= 1024 and not fits(replace(s, fraction=high, context_length=context), target, draft):
        context -= 1024
    return max(context, 0)
