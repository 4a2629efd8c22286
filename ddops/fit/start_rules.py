"""Flags the bundled runtime refuses at start once it has read the checkpoint, known here first.

A runtime whose memory model is "exact" (the bundled runtime: every allocation follows
serving.contract.runtime) serves a hybrid target with a speculative method one sequence at a
time, from its own cache of context + verify rows, and refuses --max-total-tokens there
(`max_total_tokens_problem`) rather than ignore it. ddops knows the target is hybrid from its
config.json (ddops.fit.model facts) and the method from the profile or the unit's command line
(METHODS capabilities), so `ddops fit`, `ddops preflight` and deploy's planning stop such a
change with exit 2 before a host is touched.
"""

from __future__ import annotations

from ddops.fit.memory_models import MEMORY_MODELS
from ddops.fit.model import ModelFacts
from ddops.fit.profile_fit import Reader
from ddops.profile import RUNTIMES, Profile, Runtime
from ddops.profile.runtimes import POOL_CAP_FLAG
from ddops.profile.extra_args import int_value
from serving.contract.runtime import max_total_tokens_problem

POOL_FLAG = POOL_CAP_FLAG


def applies(runtime: Runtime, speculative: bool, max_total_tokens: int | None) -> bool:
    """Whether the target's facts are needed to decide (read them only then)."""
    return MEMORY_MODELS[runtime.memory_model].contract_start_rules and speculative and max_total_tokens is not None


def refused(runtime: Runtime, target: ModelFacts, speculative: bool, max_total_tokens: int | None) -> list[str]:
    """One line per flag the runtime would refuse at start for this target."""
    if not applies(runtime, speculative, max_total_tokens):
        return []
    problem = max_total_tokens_problem(target.linear is not None, speculative, max_total_tokens)
    return [problem] if problem else []


def profile_refusals(profile: Profile, read: Reader) -> list[str]:
    """The same for a profile (the flag from sglang.extra_args), reading the target only when needed."""
    if not applies(RUNTIMES[profile.runtime], profile.method.is_speculative, int_value(profile, POOL_FLAG)):
        return []
    return target_refusals(profile, read(profile.model.path))


def target_refusals(profile: Profile, target: ModelFacts) -> list[str]:
    """For a profile whose target's facts are already read (the flag is in sglang.extra_args)."""
    return refused(RUNTIMES[profile.runtime], target, profile.method.is_speculative, int_value(profile, POOL_FLAG))
