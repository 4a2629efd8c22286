"""The engine runs in a process of its own (serving.engine.process): a client leaving stops its
generation there, and the server stops (exit 1, for systemd to restart it) when that process dies.
Real `python -m serving` processes on loopback, tiny checkpoint."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import httpx
import openai
import pytest

from tests.server_process import ServerProcess


def engine_pid(server) -> int:
    """The engine's process, as /server_info names it: a child of the server's."""
    pid = httpx.get(server.url + "/server_info").json()["engine_pid"]
    assert str(pid) in Path(f"/proc/{server.process.pid}/task/{server.process.pid}/children").read_text().split()
    return pid


def metric(url: str, name: str) -> float:
    text = httpx.get(url + "/metrics").text
    return next((float(x.split()[-1]) for x in text.splitlines() if x.startswith(name + " ")), 0.0)


@pytest.fixture
def server(tiny_llama, tmp_path):
    proc = ServerProcess(tiny_llama, tmp_path / "server.log", "--served-model-name", "tiny",
                         "--context-length", "4096").wait_ready()
    yield proc
    proc.stop()


def test_a_client_leaving_stops_its_generation_in_the_engine_process(server):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=60)
    stream = client.completions.create(model="tiny", prompt="hi", max_tokens=3000, stream=True,
                                       extra_body={"ignore_eos": True})
    next(iter(stream))
    stream.close()
    deadline = time.monotonic() + 60
    while metric(server.url, "serving_generation_tokens_total") == 0 and time.monotonic() < deadline:
        time.sleep(0.05)                       # counted once the engine process says it ended
    generated = metric(server.url, "serving_generation_tokens_total")
    assert 0 < generated < 3000                # cancelled there, not run to max_tokens
    assert httpx.get(server.url + "/metrics").text.count('status="499"') >= 1


def test_the_server_stops_with_exit_1_when_its_engine_process_dies(server):
    os.kill(engine_pid(server), signal.SIGKILL)
    assert server.process.wait(timeout=30) == 1
    assert "the engine process exited" in server.log.read_text()


def test_a_stopped_server_takes_its_engine_process_with_it(server):
    pid = engine_pid(server)
    assert httpx.post(server.url + "/v1/completions", json={"prompt": "hi", "max_tokens": 4}).status_code == 200
    server.process.send_signal(signal.SIGTERM)
    assert server.process.wait(timeout=30) in (0, -signal.SIGTERM)   # uvicorn re-raises what it handled
    assert "Finished server process" in server.log.read_text()       # after a graceful shutdown
    deadline = time.monotonic() + 10
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not Path(f"/proc/{pid}").exists()
