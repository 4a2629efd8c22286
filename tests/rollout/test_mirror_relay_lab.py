"""The mirror relay as ddops installs it, on a real lab host (systemd, journald): its unit
follows a unit's journal, where a stand-in production prints vLLM's real captured request
lines (tests/rollout/data/vllm_request_log.txt) plus one line past journald's LineMax. The
records go to a stand-in sink on this machine's side of the lab bridge; the real sink and a
real vLLM are tests/rollout/test_vllm_across.py's mirror test. Reuses the session's lab."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

from ddops.remote import connect
from ddops.rollout.host_changes import dialable
from ddops.rollout.shadow import relay_unit

pytestmark = pytest.mark.lab

DATA = Path(__file__).parent / "data"
FAKE = "mirror-fake-vllm.service"
PORT = 39002


class Sink(BaseHTTPRequestHandler):
    received: list = []

    def do_POST(self):
        body = self.rfile.read(int(self.headers["Content-Length"]))
        Sink.received.append((self.headers.get("Authorization"), json.loads(body)))
        self.send_response(202)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


def long_line(lines: str) -> str:
    """A prompt line of ~60 kB: journald (LineMax 48K) splits it."""
    first = next(line for line in lines.splitlines() if "details: prompt:" in line)
    return first.replace("chatcmpl-998822f618b37a33", "chatcmpl-long").replace(
        "prompt_token_ids: [1,", "prompt_token_ids: [" + "1, " * 20000 + "1,")


def test_relay_unit_follows_a_units_journal_and_sends_its_records(lab_hosts):
    sink = ThreadingHTTPServer((lab_hosts.env["DDOPS_LAB_SUBNET"] + ".1", 0), Sink)
    threading.Thread(target=sink.serve_forever, daemon=True).start()
    host = lab_hosts.host("lab-1")
    lines = (DATA / "vllm_request_log.txt").read_text()
    answers = json.loads((DATA / "vllm_request_log.answers.json").read_text())
    with connect(host) as remote:
        try:
            remote.write("/root/mirror-lines.txt", lines + long_line(lines) + "\n")
            # The stand-in pings until the relay has read a line (its journalctl opens the journal
            # a moment after the unit starts; lines logged before that are never seen), then logs.
            remote.write("/root/mirror-fake.sh", "while [ ! -e /root/mirror-go ]; do echo ping; sleep 0.2; done\n"
                         "cat /root/mirror-lines.txt\nexec sleep infinity\n")
            remote.write(f"/etc/systemd/system/{FAKE}", "[Service]\nType=exec\n"
                         "ExecStart=/bin/sh /root/mirror-fake.sh\n")
            files = relay_unit.render(FAKE, f"http://{sink.server_address[0]}:{sink.server_address[1]}", PORT,
                                      None, 0.5, "lab-relay-key", "vllm")
            name = relay_unit.install(remote, files)
            assert remote.run(f"stat -c %a {relay_unit.ENV_DIR}/{name.removesuffix('.service')}.env").stdout.strip() == "600"
            remote.run(f"rm -f /root/mirror-go && systemctl daemon-reload && systemctl restart {FAKE}")
            with dialable(host, f"http://127.0.0.1:{PORT}") as url:
                def read_counts():
                    return httpx.get(f"{url}/mirror", headers={"Authorization": "Bearer lab-relay-key"},
                                     trust_env=False).json()
                deadline = time.monotonic() + 30
                while read_counts()["lines_read"] == 0 and time.monotonic() < deadline:
                    time.sleep(0.2)
                remote.run("touch /root/mirror-go")
                while len(Sink.received) < 3 and time.monotonic() < deadline + 30:
                    time.sleep(0.2)
                counts = read_counts()
        finally:
            relay_unit.remove(remote, FAKE)
            remote.run(f"systemctl stop {FAKE}; rm -f /etc/systemd/system/{FAKE} /root/mirror-lines.txt "
                       "/root/mirror-fake.sh /root/mirror-go; "
                       "systemctl daemon-reload", check=False)
            sink.shutdown()
        assert remote.run(f"systemctl is-active {name}", check=False).stdout.strip() != "active"
    assert (counts["offered"], counts["sent"], counts["streamed"], counts["truncated"]) == (3, 3, 1, 1)
    assert [auth for auth, _ in Sink.received] == ["Bearer lab-relay-key"] * 3
    assert Sink.received[0][1]["answer_ids"] == answers["chat"]["token_ids"]
