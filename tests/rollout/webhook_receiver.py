"""A real HTTP server on loopback that records every webhook POST (tests only)."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Receiver:
    """`url` accepts POSTs; `received` holds (path, JSON body) in arrival order. The first
    `fail_first` requests get a 503, to exercise retries."""

    def __init__(self, fail_first: int = 0) -> None:
        self.received: list[tuple[str, dict]] = []
        self.attempts = 0
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                receiver.attempts += 1
                if receiver.attempts <= fail_first:
                    self.send_response(503)
                    self.end_headers()
                    return
                receiver.received.append((self.path, json.loads(body)))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> "Receiver":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()
