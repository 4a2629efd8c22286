"""Result documents built by the code that writes them in production: a shadow comparison from
`Comparison` (stats arithmetic over samples) and a rollout state from the rollout loop with
scripted hosts and a scripted analysis (the lab tests report on real ones)."""

from __future__ import annotations

import random

from ddops.rollout.shadow.compare import Comparison, Settings
from ddops.rollout.fleet.loop import Limits, Rollout
from ddops.rollout.shadow.stats import Sample, agree, summarize
from ddops.rollout.shadow.judge import judge
from ddops.profile.schema import RolloutSpec
from tests.rollout.test_fleet_loop import Hosts, make

TEXT = "def fizzbuzz(n):\n    for i in range(1, n + 1):\n        print(i)"


def shadow_doc() -> dict:
    rng = random.Random(4)
    production, shadow = [], []
    for i in range(24):
        text = TEXT if i % 6 else TEXT.replace("print(i)", "print('Fizz')")  # every 6th differs
        ids = tuple(ord(c) for c in text)
        production.append(Sample(f"p{i}", TEXT, tuple(ord(c) for c in TEXT), 20,
                                 0.8 + rng.random() * 0.4, 0.05 + rng.random() * 0.02))
        shadow.append(Sample(f"p{i}", text, ids, 20, 0.5 + rng.random() * 0.3, 0.06 + rng.random() * 0.02))
    agreements = tuple(agree(a, b) for a, b in zip(production, shadow))
    equal = sum(a.equal for a in agreements)
    comparison = Comparison(Settings(count=24), summarize("production", production, 6.0, 1.0),
                            summarize("shadow", shadow, 4.0, 2.7), agreements,
                            {"production": tuple(production), "shadow": tuple(shadow)},
                            sum(a.matched for a in agreements) / sum(a.compared for a in agreements), equal)
    verdict = judge(comparison, RolloutSpec())
    return {"production_url": "http://10.0.0.1:30000", "shadow_url": "http://10.0.0.2:30001",
            "comparison": comparison.to_dict(), "verdict": verdict.to_dict()}


class Watcher:
    """Records samples through the rollout like bake.Watcher: h1 regresses at its third sample."""

    def __init__(self):
        self.rollout = None

    def bake(self, hosts, unchanged):
        verdicts = {}
        for host in hosts:
            bad = host == "h1"
            for n in range(1, 4):
                ratio = 0.5 if bad and n == 3 else 0.0
                window = {"requests": 4 * n, "error_ratio": ratio, "ttft_p95": 0.05 + 0.01 * n}
                checks = [{"metric": "error_ratio", "value": ratio, "baseline": 0.0,
                           "status": "fail" if ratio > 0.1 else "pass",
                           "reason": f"error_ratio {ratio} > max 0.1" if ratio > 0.1 else ""}]
                self.rollout.record(host, "sample", {"time": 1000.0 + 2 * n, "window": window,
                                                     "baseline": {"ttft_p95": 0.05, "error_ratio": 0.0},
                                                     "verdict": checks[0]["status"], "checks": checks})
            verdicts[host] = {"status": "failed" if bad else "passed", "passed": not bad,
                              "reasons": ["error_ratio 0.5 > max 0.1"] if bad else []}
            self.rollout.record(host, "verdict", verdicts[host])
        return verdicts


def rollout_doc(tmp_path) -> dict:
    _, state, store = make(tmp_path, ["h1", "h2", "h3"])
    watcher = Watcher()
    rollout = Rollout(state, store, Limits(0, 6.0, 4), Hosts().deploy, Hosts().revert,
                      watcher=watcher)
    watcher.rollout = rollout
    rollout.on_event("start", {"hosts": ["h1", "h2", "h3"],
                               "checks": [{"metric": "error_ratio", "max": 0.1},
                                          {"metric": "ttft_p95", "max_ratio": 2.0}]})
    return {**rollout.run().to_dict(), "exit_code": 1, "meaning": "gate failed and reverted",
            "notifications": [{"webhook": "$SLACK_WEBHOOK_URL", "format": "slack", "sent": 7, "failed": []}]}
