"""What a rollout watches while it bakes: checks on each changed host's /metrics, and PromQL
queries to the operator's Prometheus.

Used in a profile's `rollout.analysis` (the defaults) and in a plan's `analysis` (which
replaces the profile's as a whole). Each check names one figure of `ddops.rollout.fleet.scrape`
and bounds it absolutely (`max`, `min`) and/or against the baseline (`max_ratio`,
`min_ratio`: value / baseline value). Each query (`prometheus.queries`) is PromQL in which
`$host` and `$unit` stand for the judged host's inventory name and unit, bounded by `max` and/or
`min` (docs/monitoring.md, "Rollout analysis in PromQL").
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

Metric = Literal["error_ratio", "tokens_per_s", "accept_length",
                 "ttft_p50", "ttft_p90", "ttft_p95", "ttft_p99",
                 "itl_p50", "itl_p90", "itl_p95", "itl_p99",
                 "e2e_p50", "e2e_p90", "e2e_p95", "e2e_p99"]
NonNegative = Annotated[float, Field(ge=0)]


class Section(BaseModel):  # as schema.Section (which imports this module)
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class CheckSpec(Section):
    metric: Metric
    max: NonNegative | None = None
    min: NonNegative | None = None
    max_ratio: Annotated[float, Field(gt=0)] | None = None
    min_ratio: Annotated[float, Field(gt=0)] | None = None

    @model_validator(mode="after")
    def _has_bound(self) -> "CheckSpec":
        if (self.max, self.min, self.max_ratio, self.min_ratio) == (None, None, None, None):
            raise ValueError(f"{self.metric}: give at least one of max, min, max_ratio, min_ratio")
        return self


class ProbeSpec(Section):
    """Synthetic chat requests the rollout sends itself while baking (when real traffic is thin)."""

    rate_per_s: Annotated[float, Field(gt=0, le=50)] = 1.0
    max_tokens: Annotated[int, Field(ge=2, le=512)] = 8
    prompt: Annotated[str, Field(min_length=1)] = "Write one sentence about the sea."


class MirrorRequirement(Section):
    """A mirroring shadow's result the rollout needs before its canary (docs/mirror.md)."""

    min_requests: Annotated[int, Field(ge=1)] = 16         # mirrored requests compared
    min_token_equality: Annotated[float, Field(ge=0, le=1)] | None = 1.0  # on deterministic ones
    min_accept_length: Annotated[float, Field(ge=1)] | None = None       # the shadow's, on them


class PromQuery(Section):
    """One PromQL query, judged for each changed host at every sample of its bake."""

    name: Annotated[str, Field(pattern=r"^[a-z][a-z0-9_]*$")]
    query: Annotated[str, Field(min_length=1)]     # `$host`, `$unit`: the judged host's name and unit
    max: float | None = None
    min: float | None = None

    @model_validator(mode="after")
    def _has_bound(self) -> "PromQuery":
        if self.max is None and self.min is None:
            raise ValueError(f"{self.name}: give max, min or both")
        return self


class PrometheusSpec(Section):
    address: Annotated[str, Field(pattern=r"^https?://")]    # the operator's Prometheus
    queries: Annotated[list[PromQuery], Field(min_length=1)]
    timeout_s: Annotated[float, Field(gt=0, le=120)] = 10.0


class AnalysisSpec(Section):
    checks: list[CheckSpec] = []
    prometheus: PrometheusSpec | None = None  # queries to the operator's Prometheus, beside the checks
    mirror: MirrorRequirement | None = None  # required of the recorded shadow before the canary
    interval_s: Annotated[float, Field(gt=0, le=3600)] = 5.0  # between samples
    min_requests: Annotated[int, Field(ge=1)] = 10  # in the window before any check is judged
    baseline: Literal["before", "unchanged"] = "before"
    probe: ProbeSpec | None = None
    on_no_traffic: Literal["halt", "pass"] = "halt"  # bake ended below min_requests

    @model_validator(mode="after")
    def _judges_something(self) -> "AnalysisSpec":
        if not self.checks and self.prometheus is None:
            raise ValueError("give checks (on each host's /metrics), prometheus queries, or both")
        return self
