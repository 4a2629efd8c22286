"""Write ddops/data/vllm-VERSION.json from an installed vLLM's own parser:

    python -m ddops.vllm.table --python /path/to/vllm-venv/bin/python

Runs `parser_facts.PROBE` with that interpreter (ddops never imports vLLM) and writes what it
prints, so the version table is the released wheel's facts, not a transcription.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

from ddops.vllm.parser_facts import PROBE, ParserFacts, parse
from ddops.vllm.versions import DATA


def probe(python: str, timeout: float = 300) -> ParserFacts:
    """Ask the vLLM at `python` for its parser facts (about 10 s: vLLM's imports)."""
    done = subprocess.run([python, "-c", PROBE], capture_output=True, text=True, timeout=timeout,
                          env={"VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", "PATH": "/usr/bin:/bin"})
    if done.returncode != 0:
        raise SystemExit(f"{python}: vLLM's parser probe exited {done.returncode}: {done.stderr.strip()[-400:]}")
    return parse(done.stdout)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ddops.vllm.table", description=__doc__.splitlines()[0])
    parser.add_argument("--python", required=True, help="the interpreter of a venv holding vLLM")
    args = parser.parse_args(argv)
    facts = probe(args.python)
    path = DATA / f"vllm-{facts.version.split('+')[0]}.json"
    path.write_text(json.dumps(facts.as_json(), indent=1, sort_keys=True) + "\n", encoding="utf-8")
    print(f"{path}: vLLM {facts.version}, {len(facts.flags)} flags, {len(facts.methods)} speculative methods")
    return 0


if __name__ == "__main__":
    sys.exit(main())
