"""`ddops demo`: the main job end to end on this machine.

lab up (one systemd-nspawn host with the runtime) -> tiny target + distilled DFlash draft
(made once into $DDOPS_CACHE/models/demo-<digest of the runtime's model tools> by those tools,
run as commands, so a change to the tools rebuilds them instead of pushing a stale draft) -> push
them -> deploy the DDTree CPU profile (facts, plan, lock, push, restart, gate) -> a chat
request answered from outside the host, with the API key the cpu-* profiles require
($DDOPS_API_KEY, or one made once into $DDOPS_CACHE/demo-api-key, mode 0600). SmolLM2-135M is deployed as well when `make models`
has converted it (and its draft when one is cached)."""

from __future__ import annotations

import hashlib
import importlib.util
import os
import secrets
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import httpx

from ddops import server_info
from ddops.deploy import show
from ddops.deploy.apply import Outcome, execute
from ddops.deploy.desired import API_KEY_ENV, api_key_of
from ddops.deploy.facts import read_facts
from ddops.deploy.lock import Holder
from ddops.deploy.plan import make_plan
from ddops.deploy.target import load_target


@dataclass(frozen=True)
class Service:
    profile: str
    unit: str | None
    port: int | None
    models: tuple[str, ...]          # directories under $DDOPS_CACHE/models, pushed by their last name


MODEL_TOOLS = ("tiny.py", "draft_files.py", "tiny_draft.py", "train_draft.py")   # under serving/tools
TINY_MODELS = ("tiny-llama", "tiny-llama-dflash")


def cache() -> Path:
    return Path(os.environ.get("DDOPS_CACHE", "/var/cache/ddops"))


def tools_key() -> str:
    """Digest of the runtime's model tools (located, never imported: ddops imports only serving.contract)."""
    spec = importlib.util.find_spec("serving")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("demo: the bundled runtime (package serving) is not installed in this Python")
    tools = Path(next(iter(spec.submodule_search_locations))) / "tools"
    digest = hashlib.sha256()
    for name in MODEL_TOOLS:
        path = tools / name
        digest.update(path.read_bytes() if path.is_file() else b"-")
    return digest.hexdigest()[:12]


def api_key() -> str:
    """$DDOPS_API_KEY when set, else the demo's own key, made once and kept 0600 in the cache."""
    if os.environ.get(API_KEY_ENV):
        return os.environ[API_KEY_ENV]
    path = cache() / "demo-api-key"
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        os.write(fd, secrets.token_urlsafe(24).encode())
        os.close(fd)
    return path.read_text().strip()


def tiny_root() -> Path:
    return cache() / "models" / f"demo-{tools_key()}"


def services() -> list[Service]:
    found = [Service("cpu-ddtree", None, None, tuple(f"{tiny_root().name}/{n}" for n in TINY_MODELS))]
    models = cache() / "models"
    if (models / "smollm2-135m-instruct" / "config.json").is_file():
        draft = (models / "smollm2-135m-instruct-dflash" / "config.json").is_file()
        found.append(Service("cpu-smollm2-ddtree" if draft else "cpu-smollm2-ar", "smollm2.service",
                             30001, ("smollm2-135m-instruct",) + (("smollm2-135m-instruct-dflash",)
                                                                 if draft else ())))
    return found


def make_tiny_models() -> None:
    """The runtime's tools write them (run as commands: ddops imports only serving.contract), into a
    temporary directory renamed into place, so a half-built pair is never pushed."""
    root = tiny_root()
    if all((root / name / "model.safetensors").is_file() for name in TINY_MODELS):
        return
    tmp = root.with_name(root.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    target, draft = tmp / "tiny-llama", tmp / "tiny-llama-dflash"
    show.stage("models", f"serving.tools.tiny, serving.tools.tiny_draft --distill -> {root} "
                         "(once per version of the model tools; the draft distills for a minute or two)")
    for step in (["serving.tools.tiny", "--out", str(target)],
                 ["serving.tools.tiny_draft", "--target", str(target), "--out", str(draft), "--distill"]):
        subprocess.run([sys.executable, "-m", *step], check=True, capture_output=True)
    shutil.rmtree(root, ignore_errors=True)
    tmp.rename(root)
    for stale in root.parent.glob("demo-*"):    # pairs built by older tools
        if stale != root and ".tmp" not in stale.name:
            shutil.rmtree(stale, ignore_errors=True)


def lab_up(count: int = 1) -> tuple[Path, list[str]]:
    from ddops.lab import lifecycle
    from ddops.lab.layout import LabLayout
    layout = LabLayout.from_env()
    slots = lifecycle.up(layout, count, log=lambda line: show.console.print(f"    {line}"))
    return layout.inventory, [s.name for s in slots]


def push_models(remote, service: Service) -> None:
    from ddops.install.sync import push_model
    for name in service.models:
        report = push_model(remote, cache() / "models" / name, log=lambda line: None)
        show.console.print(f"    {name}: copied {len(report.copied)} file(s) "
                           f"({report.bytes_copied / 1e6:.1f} MB), {len(report.skipped)} already there")


def deploy(service: Service, host: str, inventory: Path) -> Outcome:
    from ddops.remote import connect
    target = load_target(service.profile, host, inventory=inventory, unit_name=service.unit,
                         port=service.port)
    show.stage("deploy", f"{service.profile} -> {host} ({target.desired.unit_name})")
    with connect(target.host) as remote:
        push_models(remote, service)
        desired = target.desired
        plan = make_plan(desired, read_facts(remote, desired.unit_name, desired.unit_path, desired.env_path))
        show.plan(plan)
        holder = Holder.here(f"ddops demo ({service.profile})")
        outcome = execute(remote, desired, target.spec, holder, progress=show.progress)
    show.outcome(outcome)
    if outcome.code == 0:
        ask(target.spec.base_url, target.spec.served_model, api_key_of(desired.env_text))
    return outcome


def ask(base_url: str, model: str, key: str | None) -> None:
    """A request from outside the host, as a client would send it (with the service's key)."""
    body = {"model": model, "max_tokens": 24, "temperature": 0,
            "messages": [{"role": "user", "content": "What is the capital of France?"}]}
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    with httpx.Client(base_url=base_url, headers=headers, trust_env=False, timeout=120) as client:
        answer = client.post("/v1/chat/completions", json=body).json()
        info = server_info.read_or_empty(client)
    text = answer["choices"][0]["message"]["content"]
    accept = server_info.accept_length(info) or 1.0
    rounds = server_info.accept_rounds(info)
    show.stage("request", f"POST {base_url}/v1/chat/completions from outside the host")
    show.console.print(f"    answer: {text!r}")
    # A speculative lane reports the setting its controller runs; plain decoding has no lane
    # (its server arguments still say speculative_adaptive "on", the default).
    setting = info.get("speculative_current_setting")
    show.console.print(f"    method {info.get('speculative_algorithm') or 'plain'}"
                       f"{f' (adaptive, running {setting})' if setting else ''}, "
                       f"draft's average accepted length {accept:.2f}"
                       f"{f' over {rounds} rounds' if rounds else ''}, "
                       f"{server_info.throughput(info) or 0:.1f} tokens/s")


def run() -> int:
    os.environ[API_KEY_ENV] = api_key()   # what the cpu-* profiles read (service.secrets.api_key_env)
    show.stage("lab", "one systemd-nspawn host with the runtime (kept if already running)")
    inventory, hosts = lab_up()
    make_tiny_models()
    found = services()
    if not any(s.profile == "cpu-smollm2-ddtree" for s in found):
        show.console.print("    note: SmolLM2 runs plain until its drafter is trained: `make drafter` (about 20 "
                           "minutes of CPU, once), then `make demo` deploys it with DDTree too")
    codes = [deploy(service, hosts[0], inventory).code for service in found]
    show.stage("done", f"`ddops status --host {hosts[0]}` shows it; `ddops lab down` removes the lab")
    return max(codes)
