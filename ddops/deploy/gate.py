"""Readiness gate: "can generate with speculation", not "port open".

Order (each must pass before the next runs):
  health        GET /health answers 200 within the profile's timeout, while the unit is
                watched (`watch`, a long-poll: deploy.unitwatch) so a crash or a restart loop
                fails the gate at once;
  generate      GET /health_generate answers 200 (a real prefill plus one draft + verify round
                through the method), for a runtime that has that probe route (not vLLM);
  smoke         a multi-token chat request with the profile's smoke settings returns text;
  server_info   what the server says it serves. SGLang and the bundled runtime: /server_info
                reports the intended model, method and tree budget. vLLM ("models"): /v1/models
                lists the served name, with the model path as its `root` and the profile's
                max_model_len;
  acceptance    speculative methods only (from METHODS capabilities): the draft accepts
                drafts, judged on what the draft does, never on which rounds an adaptive
                controller chose to verify. The bundled runtime's /health_generate verifies
                every round of its probe at the method's widest setting and reports their
                tokens per round (`accept_length`) and how many (`spec_rounds`): with at least
                PROBE_ROUNDS rounds that figure is the verdict, above 1 passes. Otherwise
                (SGLang, whose probe is one token) the average accepted length after the smoke
                request (/server_info internal_states[0].avg_spec_accept_length) must be above
                1; for vLLM ("metrics") it is 1 + accepted / drafts from its spec-decode
                counters. The check's detail names the figure and the rounds it rests on.
A request after health that fails in transport (refused, reset, closed; not timed out) while the
unit is still up and has not restarted is tried again for up to RIDE_S: the path to the host
broke (a dropped link, a frozen SSH tunnel), not the service, and a gate failed by it would
revert a good change (a 45 s link drop mid-gate did, `python -m ddops.lab.faults --fault drop`,
2026-12-06). A unit that died or restarted fails the request at once, as a server that crashes
on its first request must.
Which of these a runtime answers is its table's capabilities (profile/runtimes.py), carried in
the GateSpec; nothing here asks a runtime's name.
The decisions (`check_*`) are pure; `run_gate` does the HTTP and the waiting.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Callable

import httpx

from ddops import server_info, spec_metrics
from ddops.deploy.facts import UnitState
from ddops.deploy.unitwatch import RIDE_S
from ddops.profile.launch import read_launch
from ddops.profile.methods import reported_algorithm
from ddops.remote.session import ConnectionLost
from ddops.server_info import accept_length, accept_rounds

PROBE_ROUNDS = 4   # a probe's figure is a verdict once it rests on this many rounds, not one lucky one


@dataclass(frozen=True)
class GateSpec:
    base_url: str                       # http://ADDR:PORT the gate (and clients) reach
    model_path: str                     # expected /server_info model_path
    served_model: str                   # `model` the smoke request sends
    algorithm: str | None               # expected speculative_algorithm (SGLang spelling) or None
    speculative: bool                   # METHODS: is_speculative -> acceptance must exceed 1
    draft_path: str | None = None
    budget: int | None = None           # expected speculative_ddtree_budget
    uses_tree_budget: bool = False      # METHODS: uses_tree_budget -> a budget must be reported
    health_path: str = "/health"
    generate_path: str | None = "/health_generate"   # None: the runtime has no probe route
    identity: str = "server_info"       # runtime table: "server_info" or "models" (/v1/models)
    acceptance: str = "server_info"     # runtime table: "server_info" or "metrics" (/metrics)
    max_model_len: int | None = None    # identity "models": the context the profile asks for
    timeout_s: float = 600.0
    generate_timeout_s: float = 60.0
    messages: tuple[dict, ...] = ({"role": "user", "content": "Count from one to ten in words."},)
    max_tokens: int = 32
    temperature: float = 0.0
    top_p: float = 1.0

    def as_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "GateSpec":
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        known["messages"] = tuple(known.get("messages", cls.messages))
        return cls(**known)


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str
    seconds: float


@dataclass
class GateReport:
    checks: list[Check] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return bool(self.checks) and all(c.ok for c in self.checks)

    @property
    def failure(self) -> Check | None:
        return next((c for c in self.checks if not c.ok), None)

    def as_dict(self) -> dict:
        return {"passed": self.passed, "checks": [asdict(c) for c in self.checks]}


# -- pure decisions ------------------------------------------------------------------------

def check_unit(state: UnitState, restarts_before: int) -> str | None:
    """Why the unit is no longer starting, or None while it is still alive."""
    if state.active == "failed":
        return f"unit failed ({state.sub})"
    if state.sub == "auto-restart" or state.restarts > restarts_before:
        return f"unit's process exited and systemd is restarting it (restart {state.restarts + 1})"
    if state.active == "inactive":
        return "unit stopped"
    return None


def check_smoke(status: int, body: dict) -> str | None:
    if status != 200:
        message = (body.get("error") or {}).get("message", "") if isinstance(body, dict) else ""
        return f"HTTP {status} {message}".strip()
    try:
        text = body["choices"][0]["message"]["content"]
    except (KeyError, IndexError, TypeError):
        return "response has no choices[0].message.content"
    if not text or not text.strip():
        return "empty text"
    tokens = (body.get("usage") or {}).get("completion_tokens", 0)
    if tokens < 2:
        return f"only {tokens} completion token(s); the smoke request must generate several"
    return None


def check_server_info(info: dict, spec: GateSpec) -> list[str]:
    problems = []
    if info.get("model_path") != spec.model_path:
        problems.append(f"model_path is {info.get('model_path')!r}, expected {spec.model_path!r}")
    reported = reported_algorithm(info.get("speculative_algorithm"))
    if reported != spec.algorithm:
        problems.append(f"speculative_algorithm is {reported}, expected {spec.algorithm}")
    if spec.draft_path and info.get("speculative_draft_model_path") != spec.draft_path:
        problems.append(f"speculative_draft_model_path is {info.get('speculative_draft_model_path')!r}, "
                        f"expected {spec.draft_path!r}")
    budget = info.get("speculative_ddtree_budget")
    if spec.budget is not None and budget != spec.budget:
        problems.append(f"speculative_ddtree_budget is {budget}, expected {spec.budget}")
    elif spec.uses_tree_budget and not (isinstance(budget, int) and budget > 0):
        problems.append(f"speculative_ddtree_budget is {budget}, expected a positive budget")
    return problems


def check_models(body: object, spec: GateSpec) -> list[str]:
    """/v1/models (vLLM's identity): the served name listed, rooted at the model path, with the
    profile's max_model_len when it sets one."""
    entries = body.get("data") if isinstance(body, dict) else None
    if not isinstance(entries, list):
        return ["/v1/models has no data list"]
    entry = next((e for e in entries if isinstance(e, dict) and e.get("id") == spec.served_model), None)
    if entry is None:
        ids = [e.get("id") for e in entries if isinstance(e, dict)]
        return [f"/v1/models lists {ids}, not {spec.served_model!r}"]
    problems = []
    if spec.model_path and entry.get("root") != spec.model_path:
        problems.append(f"model root is {entry.get('root')!r}, expected {spec.model_path!r}")
    if spec.max_model_len is not None and entry.get("max_model_len") != spec.max_model_len:
        problems.append(f"max_model_len is {entry.get('max_model_len')!r}, expected {spec.max_model_len}")
    return problems


def check_accept_length(length: float | None, source: str) -> str | None:
    if length is None:
        return f"{source} reports no accepted length"
    if length <= 1.0:
        return f"average accepted length {length:.2f} is not above 1: speculation accepted nothing"
    return None


def check_acceptance(info: dict, spec: GateSpec) -> str | None:
    """The average accepted length /server_info reports (asked only when /health_generate did not
    report enough verified rounds to judge: `_acceptance`)."""
    if not spec.speculative:
        return None
    length = accept_length(info)
    if length is None:
        return "server_info reports no internal_states[0].avg_spec_accept_length"
    if length <= 1.0:
        return f"average accepted length {length:.2f} is not above 1: speculation accepted nothing"
    return None


# -- I/O -------------------------------------------------------------------------------------

Watch = Callable[[], UnitState]
Progress = Callable[[str, str], None]      # (check name, status text)


class Riding(httpx.BaseTransport):
    """Once armed, a request that fails in transport short of its own timeout is sent again
    (every 2 s, for up to `ride_s` from its first failure) while `alive()` says the unit is up
    and has not restarted."""

    def __init__(self, alive: Callable[[], bool], ride_s: float = RIDE_S) -> None:
        self.inner, self.alive, self.ride_s, self.armed = httpx.HTTPTransport(), alive, ride_s, False

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        first = None
        while True:
            try:
                return self.inner.handle_request(request)
            except httpx.TimeoutException:
                raise                    # no answer in the request's own time: a hang costs no more
            except httpx.TransportError:
                first = first or time.monotonic()
                if not self.armed or time.monotonic() - first >= self.ride_s or not self.alive():
                    raise
                time.sleep(2)

    def close(self) -> None:
        self.inner.close()


def run_gate(spec: GateSpec, watch: Watch, *, api_key: str | None = None,
             progress: Progress = lambda name, text: None, poll_s: float = 0.5,
             ride_s: float = RIDE_S) -> GateReport:
    report = GateReport()
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    probe: dict = {}
    restarts = watch().restarts
    riding = Riding(lambda: _still_up(watch, restarts), ride_s)
    with httpx.Client(base_url=spec.base_url, headers=headers, trust_env=False, transport=riding) as client:
        steps = (("health", lambda: _wait_health(client, spec, watch, progress, poll_s)),)
        if spec.generate_path:
            steps += (("generate", lambda: _health_generate(client, spec, probe)),)
        steps += (("smoke", lambda: _smoke(client, spec)),
                  ("server_info", lambda: _identity(client, spec)))
        if spec.speculative:
            steps += (("acceptance", lambda: _acceptance(client, spec, probe)),)
        for name, step in steps:
            progress(name, "running")
            started = time.monotonic()
            ok, detail = step()
            report.checks.append(Check(name, ok, detail, round(time.monotonic() - started, 2)))
            progress(name, "ok" if ok else "failed")
            if not ok:
                break
            riding.armed = True          # the service has answered: a broken path is ridden out
    return report


def _still_up(watch: Watch, restarts_before: int) -> bool:
    """The unit is up and has not restarted, or the watch cannot tell because the same broken
    path holds its answer (a lost connection: what riding waits out, for RIDE_S at most)."""
    try:
        return check_unit(watch(), restarts_before) is None
    except ConnectionLost:
        return True


def run_health(spec: GateSpec, watch: Watch, progress: Progress = lambda name, text: None,
               poll_s: float = 0.5) -> GateReport:
    """Only the first two checks: used to confirm a reverted service answers again."""
    report = GateReport()
    with httpx.Client(base_url=spec.base_url, trust_env=False) as client:
        steps = [("health", lambda: _wait_health(client, spec, watch, progress, poll_s))]
        if spec.generate_path:
            steps.append(("generate", lambda: _health_generate(client, spec)))
        for name, step in steps:
            started = time.monotonic()
            ok, detail = step()
            report.checks.append(Check(name, ok, detail, round(time.monotonic() - started, 2)))
            if not ok:
                break
    return report


def endpoint(argv: list[str], host_address: str) -> str:
    """Base URL of the service from its command line (contract section 1 defaults), its bind
    address and port read by the runtime tables' own spellings (launch.py)."""
    launch = read_launch(argv)
    bind, port = launch.get("service.host") or "127.0.0.1", launch.get("service.port") or "30000"
    if bind in ("0.0.0.0", "::", ""):
        bind = host_address
    return f"http://[{bind}]:{port}" if ":" in bind else f"http://{bind}:{port}"


def _wait_health(client: httpx.Client, spec: GateSpec, watch: Watch, progress: Progress,
                 poll_s: float) -> tuple[bool, str]:
    restarts_before = watch().restarts
    deadline = time.monotonic() + spec.timeout_s
    last = "no answer yet"
    while time.monotonic() < deadline:
        dead = check_unit(watch(), restarts_before)
        if dead:
            return False, f"{dead} before {spec.health_path} answered 200"
        try:
            status = client.get(spec.health_path, timeout=5).status_code
            if status == 200:
                return True, f"{spec.health_path} 200"
            last = f"HTTP {status}"
        except httpx.HTTPError as err:
            last = type(err).__name__
        progress("health", f"waiting ({last})")
        time.sleep(poll_s)
    return False, f"{spec.health_path} not 200 within {spec.timeout_s:.0f} s (last: {last})"


def _health_generate(client: httpx.Client, spec: GateSpec, probe: dict | None = None) -> tuple[bool, str]:
    """GET /health_generate; its `accept_length` (bundled runtime) goes into `probe`."""
    try:
        response = client.get(spec.generate_path, timeout=spec.generate_timeout_s)
    except httpx.HTTPError as err:
        return False, f"{spec.generate_path}: {type(err).__name__}"
    try:
        body = response.json()
    except ValueError:
        body = None
    if probe is not None and isinstance(body, dict):
        probe.update((key, float(value)) for key in ("accept_length", "spec_rounds")
                     if isinstance(value := body.get(key), (int, float)) and not isinstance(value, bool))
    return response.status_code == 200, f"{spec.generate_path} {response.status_code}"


def _smoke(client: httpx.Client, spec: GateSpec) -> tuple[bool, str]:
    body = {"model": spec.served_model, "messages": list(spec.messages), "max_tokens": spec.max_tokens,
            "temperature": spec.temperature, "top_p": spec.top_p}
    try:
        response = client.post("/v1/chat/completions", json=body, timeout=spec.generate_timeout_s)
        data = response.json()
    except (httpx.HTTPError, ValueError) as err:
        return False, f"smoke request: {type(err).__name__}: {err}"
    problem = check_smoke(response.status_code, data)
    if problem:
        return False, f"smoke request: {problem}"
    text = data["choices"][0]["message"]["content"]
    return True, f"{data['usage']['completion_tokens']} tokens: {text[:60]!r}"


def _identity(client: httpx.Client, spec: GateSpec) -> tuple[bool, str]:
    if spec.identity == "models":
        return _models(client, spec)
    return _server_info(client, spec)


def _models(client: httpx.Client, spec: GateSpec) -> tuple[bool, str]:
    try:
        response = client.get("/v1/models", timeout=30)
        body = response.json()
    except (httpx.HTTPError, ValueError) as err:
        return False, f"/v1/models: {type(err).__name__}"
    if response.status_code != 200:
        return False, f"/v1/models: HTTP {response.status_code}"
    problems = check_models(body, spec)
    if problems:
        return False, "; ".join(problems)
    return True, f"/v1/models lists {spec.served_model} ({spec.model_path})"


def _server_info(client: httpx.Client, spec: GateSpec) -> tuple[bool, str]:
    info = server_info.read(client)
    if isinstance(info, str):
        return False, info
    problems = check_server_info(info, spec)
    if problems:
        return False, "; ".join(problems)
    return True, f"{info.get('model_path')} with {spec.algorithm or 'plain decoding'}"


def _acceptance(client: httpx.Client, spec: GateSpec, probe: dict) -> tuple[bool, str]:
    """probe: /health_generate's `accept_length` and `spec_rounds` (bundled runtime), if reported."""
    rounds = probe.get("spec_rounds") or 0
    if "accept_length" in probe and rounds >= PROBE_ROUNDS:
        length, source = probe["accept_length"], f"{spec.generate_path}, {rounds:.0f} verified rounds"
        problem = check_accept_length(length, source)
        return (False, f"{problem} ({source})") if problem else \
            (True, f"average accepted length {length:.2f} ({source})")
    if spec.acceptance == "metrics":
        counted = spec_metrics.read(client)
        if isinstance(counted, str):
            return False, counted
        problem = check_accept_length(counted.accept_length, "/metrics")
        return (False, problem) if problem else (True, f"average accepted length {counted.accept_length:.2f} "
                                                       f"over {counted.drafts:.0f} drafts (/metrics)")
    info = server_info.read(client)
    if isinstance(info, str):
        return False, info
    problem = check_acceptance(info, spec)
    counted = accept_rounds(info)
    over = f" over {counted} rounds" if counted is not None else ""
    return (False, problem + over) if problem else (True, f"average accepted length {accept_length(info):.2f}{over} "
                                                          "(/server_info)")