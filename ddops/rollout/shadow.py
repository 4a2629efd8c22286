"""Shadow rollouts: a candidate profile running beside production as `<service>-shadow`.

start    deploy the candidate under the shadow unit name and port, gated like any deploy;
compare  replay prompts to both, judge against the candidate's rollout policy, save JSON;
promote  switch production to the candidate's profile, then remove the shadow;
abort    remove the shadow; production is never touched.
The running shadow is recorded locally (records.py), so later commands need no arguments.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from ddops.profile import load_profile
from ddops.profile.schema import RolloutSpec
from ddops.rollout.ci import BadInput
from ddops.rollout.compare import Comparison, Endpoint, Settings, compare
from ddops.rollout.prompts import load_prompts
from ddops.rollout.records import ShadowRecord, load_shadow, save_result
from ddops.rollout.verdict import Verdict, judge


def shadow_unit(unit: str) -> str:
    """llm.service -> llm-shadow.service"""
    return f"{unit.removesuffix('.service')}-shadow.service"


@dataclass(frozen=True)
class CompareRun:
    comparison: Comparison
    verdict: Verdict
    results_file: Path
    production: Endpoint
    shadow: Endpoint

    def to_dict(self) -> dict:
        return {"production_url": self.production.url, "shadow_url": self.shadow.url,
                "comparison": self.comparison.to_dict(), "verdict": self.verdict.to_dict(),
                "results_file": str(self.results_file)}


def api_key_of(profile) -> str | None:
    """The key the profile's server expects, read on this machine as the deploy does."""
    secrets = profile.service.secrets
    if secrets.api_key_env:
        return os.environ.get(secrets.api_key_env)
    if secrets.api_key_file:
        return Path(secrets.api_key_file).read_text().strip()
    return None


def endpoints(record: ShadowRecord | None, production_url: str | None, shadow_url: str | None,
              profile_name: str | None) -> tuple[Endpoint, Endpoint, RolloutSpec]:
    """Both endpoints and the policy: explicit URLs win over the recorded shadow."""
    profile_name = profile_name or (record.profile if record else None)
    profile = load_profile(profile_name) if profile_name else None
    prod = production_url or (record.production_url if record else None)
    cand = shadow_url or (record.url if record else None)
    if not (prod and cand):
        raise BadInput("no shadow recorded: run `ddops shadow start PROFILE --host NAME` first, "
                       "or pass --production-url and --shadow-url")
    key = api_key_of(profile) if profile else None
    policy = profile.rollout if profile else RolloutSpec()
    return (Endpoint("production", prod.rstrip("/"), api_key=key),
            Endpoint("shadow", cand.rstrip("/"), api_key=key), policy)


def run_compare(*, prompts_path: Path | None, settings: Settings, production_url: str | None = None,
                shadow_url: str | None = None, profile_name: str | None = None,
                results_dir: Path | None = None) -> CompareRun:
    record = load_shadow()
    prod, cand, policy = endpoints(record, production_url, shadow_url, profile_name)
    prompts = load_prompts(prompts_path)
    comparison = compare(prod, cand, prompts, settings)
    verdict = judge(comparison, policy)
    doc = {"shadow": record.to_dict() if record else None, "policy": policy.model_dump(),
           "comparison": comparison.to_dict(), "verdict": verdict.to_dict()}
    path = save_result("shadow-compare", doc, results_dir)
    return CompareRun(comparison, verdict, path, prod, cand)
