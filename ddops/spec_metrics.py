"""Speculative-decoding counters from a server's Prometheus `/metrics` (vLLM's spelling): how
many draft rounds ran and how many drafted tokens the target accepted. Accepted length per
round = 1 + accepted / drafts (each round also commits the target's own bonus token).

vLLM 0.32 names: `vllm:spec_decode_num_drafts_total`, `vllm:spec_decode_num_draft_tokens_total`,
`vllm:spec_decode_num_accepted_tokens_total` (docs/vllm.md). Parsed with prometheus_client's
own text parser; samples of every label set are summed.
"""

from __future__ import annotations

from dataclasses import dataclass

import httpx
from prometheus_client.parser import text_string_to_metric_families

DRAFTS = "vllm:spec_decode_num_drafts"
ACCEPTED = "vllm:spec_decode_num_accepted_tokens"
DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens"


@dataclass(frozen=True)
class SpecCounters:
    drafts: float
    draft_tokens: float
    accepted: float

    @property
    def accept_length(self) -> float | None:
        return 1.0 + self.accepted / self.drafts if self.drafts > 0 else None

    def minus(self, before: "SpecCounters") -> "SpecCounters":
        return SpecCounters(self.drafts - before.drafts, self.draft_tokens - before.draft_tokens,
                            self.accepted - before.accepted)


def parse(text: str) -> SpecCounters | str:
    """The counters from a /metrics body, or why they are not there."""
    totals = {DRAFTS: None, ACCEPTED: None, DRAFT_TOKENS: None}
    try:
        for family in text_string_to_metric_families(text):
            if family.name in totals:
                totals[family.name] = sum(s.value for s in family.samples if s.name.endswith("_total"))
    except (ValueError, TypeError, IndexError) as err:
        return f"/metrics is not Prometheus text ({type(err).__name__})"
    if totals[DRAFTS] is None or totals[ACCEPTED] is None:
        return f"/metrics has no {DRAFTS}_total / {ACCEPTED}_total (speculation is not on)"
    return SpecCounters(totals[DRAFTS], totals[DRAFT_TOKENS] or 0.0, totals[ACCEPTED])


def read(client: httpx.Client, timeout: float = 30) -> SpecCounters | str:
    try:
        response = client.get("/metrics", timeout=timeout)
    except httpx.HTTPError as err:
        return f"/metrics: {type(err).__name__}"
    if response.status_code != 200:
        return f"/metrics: HTTP {response.status_code}"
    return parse(response.text)
