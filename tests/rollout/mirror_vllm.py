"""vLLM as mirroring production, on test_vllm_across.py's servers (no server of its own: CI
time): the relay follows the real vLLM's request log, posts each finished request to the
bundled runtime's sink, and `ddops shadow compare --mirrored` reads both ends."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
from typer.testing import CliRunner

from ddops.cli import app
from ddops.rollout.shadow import relay_unit
from serving.tools.local_server import free_port

WAIT_S = 300.0


def start_relay(log, shadow_url: str, model) -> tuple[subprocess.Popen, str]:
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(relay_unit.PACKAGE.parent)}
    env.pop("DDOPS_MIRROR_KEY", None)                     # the bundled test server has no key
    relay = subprocess.Popen([sys.executable, "-m", "relay", "--log-file", str(log), "--url", shadow_url,
                              "--port", str(port), "--model", str(model), "--sample", "0.25"],
                             env=env, stderr=subprocess.PIPE, text=True)
    ready = relay.stderr.readline()
    assert "EOS ids [2]" in ready, ready                  # SmolLM2's <|im_end|>, from its config
    return relay, f"http://127.0.0.1:{port}"


def compared(shadow_url: str) -> int:
    return httpx.get(f"{shadow_url}/mirror/stats", timeout=10, trust_env=False).json()["compared"]


def mirror_and_compare(vllm_url: str, log, shadow_url: str, model, prompts, chat, tmp_path) -> dict:
    """16 greedy chats to vLLM, every other one streamed (its record carries the answer's text
    only); the CLI's --mirrored document once the shadow compared them."""
    relay, tap_url = start_relay(log, shadow_url, model)
    try:
        before = compared(shadow_url)
        with ThreadPoolExecutor(2) as pool:
            answers = list(pool.map(lambda ip: chat(vllm_url, ip[1].text, max_tokens=16, stream=ip[0] % 2 == 1),
                                    enumerate(prompts)))
        assert [a.status_code for a in answers] == [200] * len(prompts)
        deadline = time.monotonic() + WAIT_S
        while compared(shadow_url) < before + len(prompts) and time.monotonic() < deadline:
            time.sleep(0.5)
        done = CliRunner().invoke(app, ["shadow", "compare", "--mirrored", "--json", "--production-url", tap_url,
                                        "--shadow-url", shadow_url, "--results-dir", str(tmp_path / "results")])
        doc = json.loads(done.stdout)
        doc["exit_code"] = done.exit_code
        return doc
    finally:
        relay.kill()
        relay.wait()
