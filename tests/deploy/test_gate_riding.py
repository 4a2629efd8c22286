"""The gate rides out a broken path to a live unit, and never a dead or restarted one
(ddops/deploy/gate.py `Riding`), against a real HTTP server on loopback whose first connections
are dropped without an answer, as a dropped link or a frozen tunnel drops them. The lab's
`python -m ddops.lab.faults --fault drop` is the same path end to end."""

from __future__ import annotations

import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from ddops.deploy.gate import Riding


class Flaky(BaseHTTPRequestHandler):
    drops = 0     # connections still to drop without an answer

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if type(self).drops > 0:
            type(self).drops -= 1
            self.connection.shutdown(socket.SHUT_RDWR)     # no status line: the client sees the path break
            return
        body = b'{"ok": true}'
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def server():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Flaky)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


def test_a_request_whose_path_breaks_is_sent_again_while_the_unit_is_up(server):
    Flaky.drops = 2
    asked = []
    riding = Riding(lambda: asked.append(1) or True, ride_s=30)
    riding.armed = True
    with httpx.Client(base_url=server, transport=riding) as client:
        began = time.monotonic()
        response = client.post("/v1/chat/completions", json={"messages": []})
    assert response.json() == {"ok": True} and len(asked) == 2 and Flaky.drops == 0
    assert time.monotonic() - began < 10


def test_a_dead_or_restarted_unit_fails_the_request_at_once(server):
    Flaky.drops = 1
    riding = Riding(lambda: False, ride_s=30)       # the watch saw the unit restart
    riding.armed = True
    with httpx.Client(base_url=server, transport=riding) as client, pytest.raises(httpx.TransportError):
        client.post("/v1/chat/completions", json={})


def test_before_the_service_first_answered_nothing_is_ridden(server):
    Flaky.drops = 1
    riding = Riding(lambda: True, ride_s=30)        # not armed: health's own loop waits for a start
    with httpx.Client(base_url=server, transport=riding) as client, pytest.raises(httpx.TransportError):
        client.post("/v1/chat/completions", json={})


def test_a_path_that_stays_broken_fails_after_the_ride(server):
    Flaky.drops = 100
    riding = Riding(lambda: True, ride_s=3)
    riding.armed = True
    with httpx.Client(base_url=server, transport=riding) as client, pytest.raises(httpx.TransportError):
        client.post("/v1/chat/completions", json={})
    Flaky.drops = 0
