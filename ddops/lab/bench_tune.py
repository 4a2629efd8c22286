"""`ddops tune`'s model-based search against the exhaustive grid of the same space, in one run
(docs/tune.md "Measured"):

    python -m ddops.lab.bench_tune --host lab-1 --trials 6
    python -m ddops.lab.bench_tune --host lab-1 --runtime vllm --trials 3     # vLLM-CPU candidates

Pushes SmolLM2 and the project's drafter ($DDOPS_CACHE/models, from `make drafter`) to the host,
deploys `cpu-smollm2-ar` as production, then tunes `cpu-smollm2-ddtree` over SPACE twice: every
candidate (--search grid), then at most --trials of them drawn by Optuna's TPE (--search model).
It first installs the profile's runtime on the host (`ddops install-runtime`; nothing is pushed
when it is there). With `--runtime vllm` that is vLLM-CPU, and it tunes
`cpu-smollm2-vllm` over vLLM's default space with VLLM_SPACE's values (batch size and batched
tokens, eager; the table's `--gpu-memory-utilization` 0.8 and 0.9 stay): 16 candidates.
Prints both runs' choices, the model's choice as the grid measured it over the grid's best
(the goal is >= 0.95), and the model's wall time over the grid's (the goal is <= 0.5). Both
searches load production's own yardstick at their start; asserts nothing. Needs `ddops lab up`.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

from ddops.lab.bench_shadow_gate import ddops, prepare
from ddops.lab.faults import use_demo_key
from ddops.profile import load_profile

SPACE = {"speculative.algorithm": ["none", "dflash", "ddtree"], "speculative.block_size": [4, 8],
         "speculative.ddtree_budget": [8, 16, 32], "speculative.adaptive": [True, False],
         "memory.max_running_requests": [4]}
# vLLM-CPU 0.32: --max-num-seqs x --max-num-batched-tokens (vLLM's own benchmarks/auto_tune pair),
# eager (a compiled start takes 68-88 s to /health against about 30 s eager, docs/vllm.md). The
# project's draft accepts 1.00 token a round under vLLM (docs/tune.md), so DFlash candidates
# would only fail their gate.
VLLM_SPACE = {"memory.max_running_requests": [2, 4, 8, 16], "memory.chunked_prefill_size": [2048, 8192],
              "cuda_graph.enabled": [False]}
PROFILES = {"bundled": ("cpu-smollm2-ddtree", SPACE), "vllm": ("cpu-smollm2-vllm", VLLM_SPACE)}


def tune(profile: str, host: str, space: Path, search: str, trials: int | None, work: Path) -> dict:
    args = [sys.executable, "-m", "ddops", "tune", profile, "--host", host, "--space", str(space),
            "--search", search, "--concurrency", "1,4", "--count", "8", "--max-tokens", "32",
            "--budget", "2h", "--out", str(work / f"{search}.yaml"), "--yes", "--json"]
    if trials:
        args += ["--trials", str(trials)]
    done = subprocess.run(args, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    if not done.stdout.strip():
        sys.exit(f"tune --search {search}: exit {done.returncode}: {done.stderr[-2000:]}")
    return json.loads(done.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m ddops.lab.bench_tune", description=__doc__.split("\n")[0])
    parser.add_argument("--host", default="lab-1")
    parser.add_argument("--trials", type=int, default=6)
    parser.add_argument("--production", default="cpu-smollm2-ar")
    parser.add_argument("--runtime", choices=sorted(PROFILES), default="bundled",
                        help="whose candidates: the bundled runtime's or vLLM-CPU's (installed on the host first)")
    args = parser.parse_args()
    use_demo_key()
    profile, chosen_space = PROFILES[args.runtime]
    prepare(args.host, args.production, Path(os.environ.get("DDOPS_CACHE", "/var/cache/ddops")) / "models")
    runtime = load_profile(profile).runtime      # installed again, it pushes nothing
    installed = ddops("install-runtime", "--runtime", runtime, "--host", args.host)
    if installed["exit"] != 0:
        sys.exit(f"install-runtime {runtime}: {installed.get('error') or installed.get('message')}")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        space = work / "space.yaml"
        space.write_text(yaml.safe_dump(chosen_space))
        grid = tune(profile, args.host, space, "grid", None, work)
        model = tune(profile, args.host, space, "model", args.trials, work)
    by_label = {r["label"]: r for r in grid["rows"]}
    for name, doc in (("grid", grid), ("model", model)):
        chosen = doc.get("chosen") or {}
        print(json.dumps({"search": name, "exit": doc["exit_code"], "started": doc.get("started"),
                          "wall_s": doc.get("wall_s"), "chosen": chosen.get("label"),
                          "objective": chosen.get("objective"), "counts": doc.get("counts")}), flush=True)
    best, pick = grid.get("chosen"), (model.get("chosen") or {}).get("label")
    as_grid = (by_label.get(pick) or {}).get("objective")
    ratio = as_grid / best["objective"] if best and as_grid else None
    print(json.dumps({"summary": "model-based choice vs the exhaustive grid, one run",
                      "choice_over_grid_best": ratio and round(ratio, 3),
                      "wall_model_over_grid": round(model["wall_s"] / grid["wall_s"], 3)}), flush=True)


if __name__ == "__main__":
    main()
