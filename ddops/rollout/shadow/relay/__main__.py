"""`python3 -m relay --unit U --url SHADOW --port P [--format vllm|sglang] [--model DIR] [--sample F]`:
follow the unit's journal (or `--log-file`), read its request logs in the runtime's dialect
(`--format`: the runtime table's `request_log`), post each finished request's mirror record to the shadow,
serve the counts at http://127.0.0.1:P/mirror. The shadow's key comes from the environment
(DDOPS_MIRROR_KEY), never argv; the same key guards GET /mirror."""

from __future__ import annotations

import argparse
import hmac
import json
import os
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from .sender import Sender
from .source import follow_file, follow_journal
from .sglang_log import Finished
from .vllm_log import Pairing

KEY_ENV = "DDOPS_MIRROR_KEY"
# Each dialect's reader: feed(line, cut) -> record | None, and its counts.
READERS = {"vllm": Pairing, "sglang": Finished}


def eos_ids(model: str | None) -> tuple[int, ...]:
    """The ids production stops on unless a request ignores EOS (vLLM and SGLang alike):
    `eos_token_id` (an id or a list) of the model's generation_config.json and config.json."""
    found: set[int] = set()
    for name in ("generation_config.json", "config.json"):
        path = Path(model or "", name)
        try:
            value = json.loads(path.read_text()).get("eos_token_id") if model and path.is_file() else None
        except (OSError, ValueError, AttributeError):
            value = None
        for token in value if isinstance(value, list) else [value]:
            if isinstance(token, int) and not isinstance(token, bool) and token >= 0:
                found.add(token)
    return tuple(sorted(found))


class Relay:
    def __init__(self, pairing, sender: Sender, dialect: str = "vllm"):
        self.pairing, self.sender, self.dialect = pairing, sender, dialect
        self.lock = threading.Lock()
        self.lines_read = 0      # > 0: journalctl is following; lines logged before then are never seen

    def consume(self, lines) -> None:
        for line, cut in lines:
            with self.lock:
                self.lines_read += 1
                record = self.pairing.feed(line, cut)
            if record is not None:
                self.sender.offer(record)

    def status(self) -> dict:
        with self.lock:
            counts = dict(self.pairing.counts, lines_read=self.lines_read)
        return {"allowed": True, "relay": f"{self.dialect}_log", **self.sender.snapshot(), **counts}


def serve(relay: Relay, port: int, api_key: str | None) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            given = self.headers.get("Authorization", "")
            if api_key and not hmac.compare_digest(given, f"Bearer {api_key}"):
                return self._send(401, {"error": {"message": "missing or wrong API key"}})
            if self.path != "/mirror":
                return self._send(404, {"error": {"message": "not found"}})
            self._send(200, relay.status())

        def _send(self, code: int, doc: dict) -> None:
            body = json.dumps(doc).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):    # no per-request lines in the journal
            pass

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="relay", description=__doc__)
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--unit", help="the production unit whose journal to follow")
    where.add_argument("--log-file", help="a log file to follow instead")
    parser.add_argument("--url", required=True, help="the shadow, http://HOST:PORT")
    parser.add_argument("--port", type=int, required=True, help="loopback port of GET /mirror")
    parser.add_argument("--format", choices=sorted(READERS), default="vllm", help="the request logs' dialect")
    parser.add_argument("--model", help="production's model folder (its EOS ids)")
    parser.add_argument("--sample", type=float, default=0.0)
    args = parser.parse_args(argv)
    if not 0 <= args.sample <= 1:
        parser.error(f"--sample must be a fraction 0..1, got {args.sample}")
    key = os.environ.get(KEY_ENV) or None
    try:
        sender = Sender(args.url, key, args.sample)
    except ValueError as exc:
        parser.error(str(exc))
    relay = Relay(READERS[args.format](eos_ids(args.model)), sender, args.format)
    lines = follow_journal(args.unit) if args.unit else follow_file(args.log_file)
    serve(relay, args.port, key)
    threading.Thread(target=sender.run, daemon=True).start()
    print(f"relay: {args.unit or args.log_file} -> {args.url}; EOS ids {list(relay.pairing.eos_ids)}; "
          f"counts at http://127.0.0.1:{args.port}/mirror", file=sys.stderr, flush=True)
    relay.consume(lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
