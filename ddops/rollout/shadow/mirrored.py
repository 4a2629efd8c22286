"""Mirrored traffic on the ops side (docs/mirror.md): turn production's tap toward the shadow,
read both ends' figures, judge them. The runtimes do the copying and the comparing; ddops only
sends `PUT /mirror` to production (or, for a runtime whose mirror source is its request logs,
starts the relay beside it: relay_unit.py) and reads `GET /mirror` (the tap's or the relay's
counts) and `GET /mirror/stats` (the shadow's comparison). Prompts and answers never reach
this machine unless samples were asked for, and then only the shadow's bounded, redacted ones.
"""

from __future__ import annotations

import time
from contextlib import ExitStack
from dataclasses import dataclass, replace
from pathlib import Path

import httpx

from ddops.rollout.host_changes import dialable, holding, unit_argv
from ddops.profile.launch import read_launch
from ddops.profile.runtimes import RUNTIMES, Runtime
from ddops.exits import BadInput, Unreachable
from ddops.rollout.shadow.compare import Endpoint
from ddops.rollout.shadow.judge import Check, Verdict

TIMEOUT_S = 10.0
TEXT_COUNTS = ("requests", "equal", "matched_chars", "compared_chars", "sampled")


class MirrorUnavailable(BadInput):
    """An endpoint has no mirror routes, or production does not allow mirroring."""


def has_sink(runtime: str) -> bool:
    """Whether a runtime can be a mirroring shadow (the runtime table's `mirror_sink`)."""
    return RUNTIMES[runtime].mirror_sink


@dataclass(frozen=True)
class Source:
    """How production's finished requests reach the shadow, as planning found it."""
    kind: str              # the runtime table's mirror_source: "tap" or "request_log"
    model: str | None      # production's model folder (the relay reads its EOS ids there)
    dialect: str | None = None   # request_log: the runtime table's `request_log`, the relay's --format


def refuse_unless_mirrorable(candidate, host, unit_text: str | None, production: Endpoint) -> Source:
    """Planning (exit 2, before the shadow is deployed), from production's host, its unit file
    and its server (dialable here), not from a local profile file, so a production deployed
    from a profile this machine lacks is judged right: the candidate's runtime has the sink;
    the inventory lets this host mirror; production's runtime has a mirror source and its unit
    opted in (service.mirror)."""
    if not has_sink(candidate.runtime):
        able = ", ".join(n for n in RUNTIMES if has_sink(n))
        raise MirrorUnavailable(f"--mirror: the shadow profile {candidate.name} runs {candidate.runtime}, "
                                f"which has no mirror sink (runtimes with one: {able}; docs/mirror.md)")
    if not host.mirror:
        raise MirrorUnavailable(f"--mirror: the inventory forbids mirroring {host.name}'s requests "
                                f"(hosts.{host.name}.mirror: false; docs/mirror.md)")
    argv = unit_argv(unit_text)
    launch = read_launch(argv)
    table = launch.table
    if table is None or table.mirror_source is None:
        sources = ", ".join(f"{n} ({r.mirror_source})" for n, r in RUNTIMES.items() if r.mirror_source)
        raise MirrorUnavailable(f"--mirror: production on {host.name} runs {launch.runtime or 'no known runtime'}, "
                                f"which cannot mirror: ddops reads no request log of it (runtimes that "
                                f"mirror: {sources}; docs/mirror.md)")
    if table.mirror_source == "request_log":
        _refuse_unless_logging(table, argv, host.name)
    elif not tap_of(production).get("allowed"):
        raise MirrorUnavailable(f"--mirror: production at {production.url} does not opt in (set "
                                f"service.mirror: true in its profile and deploy it; docs/mirror.md)")
    return Source(table.mirror_source, launch.get("model.path"), table.request_log)


def _refuse_unless_logging(table: Runtime, argv: list[str], host: str) -> None:
    """Production's command line logs what the relay reads: every argument its table renders
    for service.mirror, and none of the flags that cut the logs."""
    wanted = [w for f in table.flags if f.key == "service.mirror" for w in (f.flag, f.value) if w]
    missing = [w for w in wanted if w not in argv]
    if missing:
        raise MirrorUnavailable(f"--mirror: production on {host} does not log its requests for "
                                f"mirroring ({' '.join(missing)} missing): set service.mirror: true in its "
                                f"profile and deploy it (docs/mirror.md)")
    cutting = [f for f in table.mirror_refuses if any(a == f or a.startswith(f + "=") for a in argv)]
    if cutting:
        raise MirrorUnavailable(f"--mirror: production on {host} runs with {', '.join(cutting)}, "
                                f"which keeps whole request logs from the relay; remove it (docs/mirror.md)")


def _client(endpoint: Endpoint) -> httpx.Client:
    headers = {"Authorization": f"Bearer {endpoint.api_key}"} if endpoint.api_key else {}
    return httpx.Client(base_url=endpoint.url, headers=headers, timeout=TIMEOUT_S, trust_env=False)


def _answer(response: httpx.Response, what: str) -> dict:
    if response.status_code == 404:
        raise MirrorUnavailable(f"{what}: {response.request.url} has no mirror routes (not the bundled "
                                f"runtime, or an older one)")
    if response.status_code == 401:
        raise MirrorUnavailable(f"{what}: {response.request.url} refused the profile's API key")
    if response.status_code == 403:
        raise MirrorUnavailable(f"{what}: {response.json().get('error', {}).get('message', 'refused')}")
    response.raise_for_status()
    return response.json()


def start_tap(production: Endpoint, shadow_url: str, shadow_key: str | None, sample: float) -> dict:
    """Point production's tap at `shadow_url` (as production's host reaches it)."""
    if not 0 <= sample <= 1:
        raise BadInput(f"--sample: a fraction 0..1 of mirrored requests kept as samples, got {sample}")
    body = {"url": shadow_url, "api_key": shadow_key, "sample": sample}
    try:
        with _client(production) as client:
            response = client.put("/mirror", json=body)
    except httpx.HTTPError as exc:
        raise Unreachable(f"production at {production.url}: {type(exc).__name__}: {exc}") from None
    return _answer(response, "production")


def start_relay(remote, record, source: Source, key: str | None, sample: float) -> tuple[str, dict]:
    """Install and start the relay beside production (relay_unit.py); its GET /mirror URL on
    production's host and its first answer."""
    from ddops.rollout.shadow import relay_unit
    if not 0 <= sample <= 1:
        raise BadInput(f"--sample: a fraction 0..1 of mirrored requests kept as samples, got {sample}")
    same_host = record.host == record.production_host
    port = relay_unit.port_for(int(record.production_url.rstrip("/").rsplit(":", 1)[1]),
                               record.port if same_host else None)
    files = relay_unit.render(record.production_unit, record.url, port, source.model, sample, key, source.dialect)
    with holding(remote, "ddops shadow start --mirror (the relay beside production)"):
        relay_unit.install(remote, files)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 15
    while True:
        try:
            with dialable(remote.host, url) as where:
                return url, tap_of(Endpoint("production", where, api_key=key))
        except (Unreachable, MirrorUnavailable):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def tap_of(production: Endpoint) -> dict:
    """Production's GET /mirror: whether it allows a tap, where it copies to, its counts."""
    return _get(production, "/mirror")


def sink_of(shadow: Endpoint) -> dict:
    """The shadow's GET /mirror/stats: what it regenerated and how it compared."""
    return _get(shadow, "/mirror/stats")


def stop_tap(production: Endpoint) -> None:
    with _client(production) as client:
        client.delete("/mirror")


@dataclass(frozen=True)
class Mirrored:
    tap: dict    # production's GET /mirror
    sink: dict   # the shadow's GET /mirror/stats

    @property
    def requests(self) -> int:
        return self.sink["compared"]

    @property
    def token_equality(self) -> float | None:
        return self.sink["deterministic"]["token_equality"]

    @property
    def text(self) -> dict:
        """Records compared by text (production's answer as text only); an older shadow: none.
        Only its known fields, checked, so what a shadow answers cannot change what is saved."""
        got = self.sink.get("text")
        if got is None:
            return dict.fromkeys(TEXT_COUNTS, 0) | {"text_equality": None}
        counts = {k: got.get(k) if isinstance(got, dict) else None for k in TEXT_COUNTS}
        equality = got.get("text_equality") if isinstance(got, dict) else "?"
        if not all(type(v) is int and v >= 0 for v in counts.values()) or not (
                equality is None or (type(equality) in (int, float) and 0 <= equality <= 1)):
            raise MirrorUnavailable(f"the shadow's /mirror/stats has a malformed text field: {str(got)[:200]!r}")
        return counts | {"text_equality": equality}

    @property
    def text_equality(self) -> float | None:
        return self.text["text_equality"]

    @property
    def accept_length(self) -> float | None:
        return self.sink["shadow"]["accept_length"]

    def to_dict(self) -> dict:
        tap, sink = self.tap, self.sink
        return {
            "mirrored": {"requests": self.requests, "offered": tap["offered"], "sent": tap["sent"],
                         # the sink's drops are the tap's refused_full, counted once
                         "dropped": tap["dropped_full"] + tap["dropped_backoff"] + sink["dropped"],
                         "failed": tap["failed"] + sink["failed"], "tap": tap,
                         "by_ids": self.requests - self.text["requests"] - self.text["sampled"],
                         "by_text": self.text["requests"] + self.text["sampled"],
                         "sink": {k: sink[k] for k in ("received", "dropped", "failed")}},
            "token_equality": self.token_equality,
            "text_equality": self.text_equality,
            "deterministic": sink["deterministic"],
            "text": self.text,
            "distribution": sink["distribution"],
            "shadow": sink["shadow"],
            "samples": sink["samples"],
        }


def read(production: Endpoint, shadow: Endpoint) -> Mirrored:
    """Both ends' figures; Unreachable (exit 6, nothing changed) when either cannot be dialed."""
    return Mirrored(tap_of(production), sink_of(shadow))


def _get(endpoint: Endpoint, path: str) -> dict:
    try:
        with _client(endpoint) as client:
            response = client.get(path)
    except httpx.HTTPError as exc:
        raise Unreachable(f"{endpoint.name} at {endpoint.url}: {type(exc).__name__}: {exc}") from None
    return _answer(response, endpoint.name)


def read_recorded(record, production: Endpoint, shadow: Endpoint, hosts: dict) -> Mirrored:
    """`read` through SSH tunnels where the recorded hosts need them (`hosts`: role -> Host)."""
    from ddops.rollout import host_changes
    tap_url = getattr(record, "tap_url", None)
    if tap_url and production.url == record.production_url.rstrip("/"):
        production = replace(production, url=tap_url)   # the relay beside production counts
    with ExitStack() as tunnels:
        live = [replace(e, url=tunnels.enter_context(host_changes.dialable(hosts[e.name], e.url)))
                if e.name in hosts else e for e in (production, shadow)]
        return read(*live)


def judge_mirrored(mirrored: Mirrored, requirement) -> Verdict:
    """`requirement`: min_requests, min_token_equality, min_accept_length (None: not checked)."""
    n, need = mirrored.requests, requirement.min_requests
    checks = [Check("mirrored requests", n >= need, float(n), f">= {need}",
                    f"{n} mirrored requests compared (need {need})")]
    equality, floor = mirrored.token_equality, requirement.min_token_equality
    by_text = mirrored.text_equality
    if floor is not None:
        # min_token_equality bounds both measures: ids where production logged them, text where it
        # logged only the text (streamed vLLM chats). Each with records is checked; with neither, fail.
        if equality is not None or by_text is None:
            ok = equality is not None and equality >= floor
            checks.append(Check("mirrored token equality", ok, equality, f">= {floor:.2%}",
                                "no deterministic mirrored requests" if equality is None else
                                f"token equality {equality:.2%} on mirrored traffic (required {floor:.2%})"))
        if by_text is not None:
            checks.append(Check("mirrored text equality", by_text >= floor, by_text, f">= {floor:.2%}",
                                f"text equality {by_text:.2%} on mirrored requests compared by text "
                                f"(required {floor:.2%})"))
    length, least = mirrored.accept_length, requirement.min_accept_length
    if least is not None:
        ok = length is not None and length >= least
        checks.append(Check("mirrored accepted length", ok, length, f">= {least:.2f}",
                            "the shadow reported no accepted length" if length is None else
                            f"accepted length {length:.2f} on mirrored traffic (required {least:.2f})"))
    return Verdict(all(c.passed for c in checks), tuple(checks))


def save(mirrored: Mirrored, verdict: Verdict, record, production: Endpoint, shadow: Endpoint,
         results_dir: Path | None) -> Path:
    from ddops.rollout.records import save_result
    doc = {"shadow": record.to_dict() if record else None, "production_url": production.url,
           "shadow_url": shadow.url, "comparison": mirrored.to_dict(), "verdict": verdict.to_dict()}
    return save_result("shadow-compare", doc, results_dir)
