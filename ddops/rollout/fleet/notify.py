"""Rollout notifications: webhooks told of start, each wave, analysis, pause, halt, revert and
finish, in order.

A webhook is `{url: ..., format: slack|json}` or `{url_env: NAME, ...}` (the URL, secret
path included, read from the environment of the ddops process). `slack` posts `{"text": ...}`
(Slack's and compatible chat tools' incoming-webhook payload); `json` posts the event itself.
Each webhook has its own thread and queue, so a slow or dead receiver delays only itself and
never the rollout; each post is retried with exponential backoff; what could not be delivered
is reported in the result document, never turned into a failure.
"""

from __future__ import annotations

import os
import queue
import threading
import time
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import httpx

from ddops import exits

FORMATS = ("slack", "json")
KEYS = {"url", "url_env", "format", "events"}


class NotifyError(exits.BadInput, ValueError):
    """A webhook entry is malformed or its environment variable is unset (bad input)."""


@dataclass(frozen=True)
class Webhook:
    url: str
    format: str = "json"
    label: str = ""  # what reports show: $NAME, or the URL without path and query
    events: tuple[str, ...] = ()  # empty: every event


def webhooks(entries, source: str, environ=os.environ) -> list[Webhook]:
    hooks = []
    for n, entry in enumerate(entries):
        where = f"{source}: notify[{n}]"
        unknown = sorted(set(entry) - KEYS)
        if unknown:
            raise NotifyError(f"{where}: {unknown[0]}: unknown key (known: {', '.join(sorted(KEYS))})")
        if ("url" in entry) == ("url_env" in entry):
            raise NotifyError(f"{where}: give exactly one of url, url_env")
        fmt = entry.get("format", "json")
        if fmt not in FORMATS:
            raise NotifyError(f"{where}: format: one of {', '.join(FORMATS)}, got {fmt!r}")
        if "url_env" in entry:
            url, label = environ.get(str(entry["url_env"]), ""), f"${entry['url_env']}"
            if not url:
                raise NotifyError(f"{where}: url_env: {entry['url_env']} is not set in the environment")
        else:
            url = str(entry["url"])
            parts = urlsplit(url)
            label = f"{parts.scheme}://{parts.netloc}"
        if urlsplit(url).scheme not in ("http", "https"):
            raise NotifyError(f"{where}: not an http(s) URL ({label})")
        hooks.append(Webhook(url, fmt, label, tuple(entry.get("events") or ())))
    return hooks


def text_of(event: dict) -> str:
    """One line for people (the Slack payload)."""
    head = f"ddops rollout {event.get('profile', '')}"
    kind = event["event"]
    if kind == "wave":
        return f"{head}: wave {event['wave']} started on {', '.join(event['hosts'])}"
    if kind == "wave_done":
        return f"{head}: wave {event['wave']} done: " + ", ".join(f"{h} {s}" for h, s in event["hosts"].items())
    if kind == "analysis":
        return f"{head}: analysis of wave {event['wave']}: " + ", ".join(
            f"{h} {v['status']}" + (f" ({'; '.join(v['reasons'])})" if v["reasons"] else "")
            for h, v in event["verdicts"].items())
    if kind == "revert":
        return f"{head}: {event['host']} {event['status']}: {event['detail']}"
    if kind in ("halt", "abort"):
        return f"{head}: {kind}: {event['reason']}; reverting changed hosts"
    if kind == "pause":
        return f"{head}: paused after wave {event['wave']}; run with --approve or --abort"
    if kind == "approve":
        return f"{head}: approved after wave {event['wave']}; continuing"
    if kind == "start":
        return f"{head}: starting on {', '.join(event['hosts'])}"
    if kind == "unreverted":
        return (f"{head}: the revert failed on {', '.join(event['hosts'])}; the rollout stays reverting: "
                "run the same command again to retry it")
    if kind == "finish":
        return f"{head}: finished, {event['status']}"
    return f"{head}: {kind}"


@dataclass
class Delivery:
    hook: Webhook
    queue: "queue.Queue" = field(default_factory=queue.Queue)
    sent: int = 0
    failures: list = field(default_factory=list)


class Notifier:
    def __init__(self, hooks: list[Webhook], attempts: int = 3, backoff_s: float = 0.5,
                 timeout_s: float = 5.0) -> None:
        self.attempts, self.backoff_s, self.timeout_s = attempts, backoff_s, timeout_s
        self.deliveries = [Delivery(h) for h in hooks]
        self.threads = [threading.Thread(target=self._work, args=(d,), daemon=True)
                        for d in self.deliveries]
        for thread in self.threads:
            thread.start()

    def send(self, event: dict) -> None:
        for delivery in self.deliveries:
            if not delivery.hook.events or event["event"] in delivery.hook.events:
                delivery.queue.put(event)

    def close(self, wait_s: float = 20.0) -> list[dict]:
        """Waits (bounded) for the queues to drain; one report per webhook."""
        for delivery in self.deliveries:
            delivery.queue.put(None)
        deadline = time.monotonic() + wait_s
        for thread in self.threads:
            thread.join(timeout=max(0.0, deadline - time.monotonic()))
        reports = []
        for delivery in self.deliveries:
            left = sum(1 for item in list(delivery.queue.queue) if item is not None)
            failures = delivery.failures + ([f"{left} event(s) not delivered before exit"] if left else [])
            reports.append({"webhook": delivery.hook.label, "format": delivery.hook.format,
                            "sent": delivery.sent, "failed": failures})
        return reports

    def _work(self, delivery: Delivery) -> None:
        with httpx.Client(timeout=self.timeout_s, trust_env=False) as client:
            while (event := delivery.queue.get()) is not None:
                error = self._post(client, delivery.hook, event)
                if error:
                    delivery.failures.append(f"{event['event']}: {error}")
                else:
                    delivery.sent += 1

    def _post(self, client: httpx.Client, hook: Webhook, event: dict) -> str | None:
        body = {"text": text_of(event)} if hook.format == "slack" else {**event, "text": text_of(event)}
        error = None
        for attempt in range(self.attempts):
            if attempt:
                time.sleep(self.backoff_s * 2 ** (attempt - 1))
            try:
                response = client.post(hook.url, json=body)
            except httpx.HTTPError as exc:
                error = f"{type(exc).__name__} after {attempt + 1} attempt(s)"
                continue
            if response.status_code < 300:
                return None
            error = f"HTTP {response.status_code} after {attempt + 1} attempt(s)"
            if response.status_code < 500 and response.status_code != 429:
                return error  # the receiver refuses this payload: retrying will not help
        return error
