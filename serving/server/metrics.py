"""Prometheus metrics: requests, tokens, latency histograms, speculative acceptance."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily

# finish_reason of a generation the client left before it ended (serving.engine.scheduler)
CANCELLED_REASON = "abort"
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
ACCEPT_BUCKETS = (1, 1.5, 2, 2.5, 3, 4, 5, 6, 8, 10, 12, 16)


class Metrics:
    def __init__(self, engine_stats=None):
        r = self.registry = CollectorRegistry()
        self.requests = Counter("serving_requests", "HTTP requests by path and status",
                                ["path", "status"], registry=r)
        self.prompt_tokens = Counter("serving_prompt_tokens", "Prompt tokens processed", registry=r)
        self.generation_tokens = Counter("serving_generation_tokens", "Tokens generated", registry=r)
        # outcome: "finished" (stop, length) or "cancelled" (the client left mid-generation)
        self.ttft = Histogram("serving_time_to_first_token_seconds", "Time to first token",
                              ["outcome"], buckets=LATENCY_BUCKETS, registry=r)
        self.e2e = Histogram("serving_e2e_request_latency_seconds", "Generation latency per request",
                             ["outcome"], buckets=LATENCY_BUCKETS, registry=r)
        self.per_token = Histogram("serving_time_per_output_token_seconds", "Decode time per output token",
                                   ["outcome"], buckets=LATENCY_BUCKETS, registry=r)
        # what the draft accepts: tokens per round of the method's widest width, whether the
        # adaptive controller verified those rounds or decoded plainly beside them
        self.accept_length = Histogram("serving_spec_accept_length",
                                       "Tokens per round of the method's widest setting, per request",
                                       buckets=ACCEPT_BUCKETS, registry=r)
        self.avg_accept = Gauge("serving_avg_spec_accept_length",
                                "Tokens per round of the method's widest setting since start", registry=r)
        self.queue_depth = Gauge("serving_queue_depth", "Requests waiting for the engine", registry=r)
        self.running = Gauge("serving_num_running_reqs", "Sequences in flight (continuous batching)", registry=r)
        self.kv_used = Gauge("serving_kv_pool_used_tokens", "KV pool rows reserved by running sequences", registry=r)
        self.kv_total = Gauge("serving_kv_pool_tokens", "KV pool rows (--max-total-tokens)", registry=r)
        self.prefix_hits = Gauge("serving_prefix_cache_hit_ratio",
                                 "Share of prompt tokens copied from the prefix cache instead of computed", registry=r)
        self.spec_info = Gauge("serving_speculative_info", "Decoding method in use (value 1)",
                               ["algorithm", "num_draft_tokens", "ddtree_budget"], registry=r)
        self.setting_tokens = Gauge("serving_spec_setting_tokens_per_round",
                                    "Moving average of tokens committed per round, per speculative setting",
                                    ["setting"], registry=r)
        self.setting_rate = Gauge("serving_spec_setting_tokens_per_second",
                                  "Moving average of tokens per second, per speculative setting", ["setting"], registry=r)
        self.setting_current = Gauge("serving_spec_setting_current",
                                     "1 for the setting the adaptive controller runs now", ["setting"], registry=r)
        # a mirroring shadow's comparisons, read at each scrape: what /mirror/stats says (the app
        # points it at its sink's Tally; None before a record arrived)
        self.mirror_tally = lambda: None
        r.register(MirrorCounters(lambda: self.mirror_tally()))
        self.engine_stats = engine_stats

    def observe(self, finished) -> None:
        """One generation's `Finished` event, completed or cancelled: every token computed counts."""
        usage = finished.usage
        outcome = "cancelled" if finished.finish_reason == CANCELLED_REASON else "finished"
        self.prompt_tokens.inc(usage.prompt_tokens)
        self.generation_tokens.inc(usage.completion_tokens)
        if usage.completion_tokens:          # a cancelled prefill has no first token to time
            self.ttft.labels(outcome).observe(usage.ttft_s)
        self.e2e.labels(outcome).observe(usage.total_s)
        if usage.completion_tokens > 1:
            self.per_token.labels(outcome).observe((usage.total_s - usage.ttft_s) / (usage.completion_tokens - 1))
        if usage.draft_accept_length is not None:
            self.accept_length.observe(usage.draft_accept_length)

    def render(self, engine=None) -> bytes:
        if engine is not None:
            self.avg_accept.set(engine.stats.avg_spec_accept_length)
            snapshot = engine.snapshot()                     # serving.engine.runner.Snapshot
            self.queue_depth.set(snapshot.queued)
            self.running.set(snapshot.running)
            runner = snapshot.info
            self.kv_total.set(runner.kv_rows)
            self.kv_used.set(runner.kv_used)
            if runner.prefix_cache:
                self.prefix_hits.set(runner.prefix_hit_rate)
            spec = runner.speculative
            self.spec_info.clear()
            self.spec_info.labels(algorithm=spec.get("speculative_algorithm") or "NONE",
                                  num_draft_tokens=str(spec.get("speculative_num_draft_tokens") or 0),
                                  ddtree_budget=str(spec.get("speculative_ddtree_budget") or 0)).set(1)
            self._settings(spec)
        return generate_latest(self.registry)

    def _settings(self, spec: dict) -> None:
        for gauge in (self.setting_tokens, self.setting_rate, self.setting_current):
            gauge.clear()
        for s in spec.get("speculative_settings") or ():
            self.setting_tokens.labels(setting=s["setting"]).set(s["tokens_per_round"])
            self.setting_rate.labels(setting=s["setting"]).set(s["tokens_per_s"])
            self.setting_current.labels(setting=s["setting"]).set(
                1 if s["setting"] == spec.get("speculative_current_setting") else 0)


class MirrorCounters:
    """serving_mirror_deterministic_total: mirrored T=0 requests this shadow regenerated and
    compared with production's answer (by tokens, or by text where production kept only text);
    serving_mirror_equal_total: those whose answers were identical. Lossless speculation keeps
    the two equal; ddops' rules alert when they part (ddops/monitor/rules.py)."""

    def __init__(self, tally_of):
        self.tally_of = tally_of

    def describe(self):
        return []

    def collect(self):
        tally = self.tally_of()
        compared = CounterMetricFamily("serving_mirror_deterministic",
                                       "Mirrored T=0 requests regenerated and compared with production's answer")
        equal = CounterMetricFamily("serving_mirror_equal", "Mirrored T=0 requests whose answer equals production's")
        compared.add_metric([], (tally.deterministic + tally.text) if tally else 0)
        equal.add_metric([], (tally.equal + tally.text_equal) if tally else 0)
        return [compared, equal]
