"""SGLang's CPU pool against `ddops fit`'s prediction, one deploy per setting (docs/sglang.md
"Memory"):

    python -m ddops.lab.bench_sglang_pool --host lab-1 --fractions 0.05,0.1,0.2,0.3,default

For each setting: a profile extending cpu-smollm2-sglang (no pool cap; `capN` caps it at N),
`ddops fit --host --json` for the prediction, `ddops deploy --force` to a unit of its own, then
the `max_total_num_tokens` and "avail mem" SGLang logged. Prints one JSON line per setting and
leaves the unit stopped. Needs `install-runtime --runtime sglang` and the model pushed to the host.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from ddops import systemd
from ddops.inventory import load_inventory
from ddops.remote import connect

UNIT, PORT = "pooltest.service", "30330"


def profile_text(setting: str) -> str:
    """cpu-smollm2-sglang at a fraction ("0.1"), at its default ("default"), or capped ("cap16384")."""
    memory = "" if setting == "default" or setting.startswith("cap") else \
        f"memory:\n  mem_fraction_static: {float(setting)}\n"
    cap = f"    - --max-total-tokens\n    - \"{int(setting[3:])}\"\n" if setting.startswith("cap") else ""
    return (f"description: pool probe ({setting})\nextends: cpu-smollm2-sglang\n{memory}"
            f"sglang:\n  extra_args:\n    - --sleep-on-idle\n{cap}")


def ddops(*args: str) -> dict:
    done = subprocess.run([sys.executable, "-m", "ddops", *args, "--json"], capture_output=True, text=True)
    return json.loads(done.stdout) if done.stdout.strip() else {"error": done.stderr[-300:]}


def measure(remote, host: str, setting: str, folder: Path) -> dict:
    path = folder / f"pool-{setting}.yaml"
    path.write_text(profile_text(setting))
    remote.run(systemd.disable_now(UNIT), check=False)
    predicted = ddops("fit", str(path), "--host", host).get("kv_pool_tokens")
    since = int(remote.run("date +%s").stdout.strip())
    deployed = ddops("deploy", str(path), "--host", host, "--unit", UNIT, "--port", PORT, "--yes", "--force")
    journal = remote.run(systemd.journal(UNIT, 5000, since=since), check=False).stdout
    remote.run(systemd.disable_now(UNIT), check=False)
    free = re.findall(r"Load weight begin\. avail mem=([0-9.]+) GB", journal)
    pool = re.findall(r"max_total_num_tokens=(\d+)", journal)
    reported = int(pool[-1]) if pool else None
    return {"setting": setting, "result": deployed.get("result"), "predicted": predicted, "reported": reported,
            "error": round(predicted / reported - 1, 4) if predicted and reported else None,
            "sglang_free_gib": float(free[-1]) if free else None}


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m ddops.lab.bench_sglang_pool", description=__doc__.split("\n")[0])
    parser.add_argument("--host", required=True)
    parser.add_argument("--fractions", default="0.05,0.1,0.2,0.3,default,cap16384")
    args = parser.parse_args()
    host = load_inventory(None).host(args.host)
    with connect(host) as remote, tempfile.TemporaryDirectory() as folder:
        for setting in args.fractions.split(","):
            print(json.dumps(measure(remote, args.host, setting.strip(), Path(folder))), flush=True)


if __name__ == "__main__":
    main()
