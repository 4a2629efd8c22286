"""The relay's bounded queue and its one sender, with the bundled tap's rules and counts."""

from __future__ import annotations

import http.client
import json
import random
import threading
import time
from collections import deque
from urllib.parse import urlsplit

QUEUE = 256            # records waiting to be sent
# connect + send + status line, per record. Longer than the tap's 2 s: the relay is its own
# process, outside production's request path, so a slow shadow only delays mirroring; at 2 s a
# shadow stalled by a loaded machine (a 2-core CI run) lost 7 of 16 records to the backoff.
SEND_TIMEOUT_S = 10.0
BACKOFF_S = 1.0        # after a failed send, drop records for this long


class Sender:
    def __init__(self, url: str, api_key: str | None, sample: float):
        parts = urlsplit(url)
        if parts.scheme != "http" or not parts.hostname or not parts.port:
            raise ValueError(f"--url must be http://HOST:PORT, got {url!r}")
        self.url, self.target, self.api_key, self.sample = url, (parts.hostname, parts.port), api_key, sample
        self.queue: deque = deque()
        self.lock = threading.Condition()
        self.backoff_until = 0.0
        self.counts = dict.fromkeys(("sent", "dropped_full", "dropped_backoff", "refused_full",
                                     "rejected", "failed"), 0)

    def offer(self, record: dict) -> None:
        """From the reading loop: never waits on the shadow."""
        with self.lock:
            if time.monotonic() < self.backoff_until:
                self.counts["dropped_backoff"] += 1
            elif len(self.queue) >= QUEUE:
                self.counts["dropped_full"] += 1
            else:
                self.queue.append({**record, "sample": random.random() < self.sample})
                self.lock.notify()

    def run(self) -> None:
        while True:
            with self.lock:
                while not self.queue:
                    self.lock.wait()
                record = self.queue.popleft()
            self._count(self.post(json.dumps(record).encode()))

    def _count(self, status: int | None) -> None:
        with self.lock:
            if status in (200, 202):
                self.counts["sent"] += 1
            elif status == 429:          # the shadow is up, its queue full: it counted the drop
                self.counts["refused_full"] += 1
            elif status is not None and 400 <= status < 500:   # this record's fault, not the shadow's
                self.counts["rejected"] += 1
            else:
                self.counts["failed"] += 1
                self.backoff_until = time.monotonic() + BACKOFF_S
                self.counts["dropped_backoff"] += len(self.queue)
                self.queue.clear()

    def post(self, body: bytes) -> int | None:
        """One POST on its own connection: the status, None when it failed before one came."""
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        connection = http.client.HTTPConnection(*self.target, timeout=SEND_TIMEOUT_S)
        try:
            connection.request("POST", "/mirror/records", body, headers)
            return connection.getresponse().status
        except (OSError, http.client.HTTPException):
            return None
        finally:
            connection.close()

    def snapshot(self) -> dict:
        with self.lock:
            return {"target": self.url, "sample": self.sample, "queued": len(self.queue),
                    "queue_limit": QUEUE, **self.counts}
