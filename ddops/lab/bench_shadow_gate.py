"""A speculative shadow's gate, run again and again beside plain production (docs/spec.md
"The gate in the lab"):

    python -m ddops.lab.bench_shadow_gate --host lab-1 --runs 10

Pushes SmolLM2 and the project's drafter ($DDOPS_CACHE/models, from `make drafter`) to the host,
deploys `cpu-smollm2-ar` as production, then each run: `ddops shadow start cpu-smollm2-ddtree`
beside it (a fresh deploy, gated), `ddops shadow compare` (T=0, both ends), `ddops shadow abort`.
Prints one JSON line per run (gate verdict, the accepted length the gate read and the rounds it
rests on, token equality, tokens/s of both ends) and a summary line. Needs `ddops lab up`.
"""

from __future__ import annotations

import argparse
import json
import sys

from ddops.lab.faults import ddops, pushed, use_demo_key


def one_run(host: str, candidate: str, prompts: int) -> dict:
    started = ddops("shadow", "start", candidate, "--host", host, "--yes")
    hosts = started.get("hosts") or [{}]
    run = {"gate": "passed" if started["exit"] == 0 else "failed", "detail": hosts[0].get("message", "")[:300]}
    if started["exit"] != 0:
        return run
    unit = started["shadow"]["unit"]
    [status] = ddops("status", "--host", host, "--unit", unit).get("units") or [{}]
    compared = ddops("shadow", "compare", "--count", str(prompts), "--max-tokens", "48")
    comparison = compared.get("comparison") or {}
    shadow, production = comparison.get("shadow") or {}, comparison.get("production") or {}
    run.update(gate_accept_length=status.get("accept_length"), token_equality=comparison.get("token_equality"),
               compare_accept_length=shadow.get("accept_length"), shadow_tokens_per_s=shadow.get("tokens_per_s"),
               production_tokens_per_s=production.get("tokens_per_s"))
    ddops("shadow", "abort", "--yes")
    return run


def prepare(host: str, production: str) -> None:
    pushed(host)
    if ddops("shadow", "status").get("shadow"):
        ddops("shadow", "abort", "--yes")
    deployed = ddops("deploy", production, "--host", host, "--yes")
    if deployed["exit"] != 0:
        sys.exit(f"production {production}: {deployed.get('message') or deployed.get('error')}")


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m ddops.lab.bench_shadow_gate", description=__doc__.split("\n")[0])
    parser.add_argument("--host", default="lab-1")
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--production", default="cpu-smollm2-ar")
    parser.add_argument("--candidate", default="cpu-smollm2-ddtree")
    parser.add_argument("--prompts", type=int, default=4)
    args = parser.parse_args()
    use_demo_key()
    prepare(args.host, args.production)
    runs = []
    for n in range(args.runs):
        runs.append({"run": n + 1, **one_run(args.host, args.candidate, args.prompts)})
        print(json.dumps(runs[-1]), flush=True)
    passed = [r for r in runs if r["gate"] == "passed"]
    equal = [r["token_equality"] for r in passed if r.get("token_equality") is not None]
    print(json.dumps({"summary": f"{len(passed)}/{len(runs)} gates passed", "token_equality_min": min(equal, default=None),
                      "gate_accept_length": sorted(r.get("gate_accept_length") or 0 for r in passed),
                      "compare_accept_length": sorted(r.get("compare_accept_length") or 0 for r in passed)}), flush=True)


if __name__ == "__main__":
    main()
