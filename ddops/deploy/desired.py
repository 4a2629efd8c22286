"""From a loaded profile and its rendered unit to what deploy works with: the files the host
should hold (`Desired`) and what the gate should see (`GateSpec`). Capabilities come from
the METHODS table through `profile.method`; no method name is compared here."""

from __future__ import annotations

from ddops.deploy.gate import GateSpec, endpoint
from ddops.deploy.plan import Desired
from ddops.profile.launch import read_launch
from ddops.profile.runtimes import RUNTIMES
from ddops.profile.rules import API_KEY_VARS
from ddops.unitsyntax import parse_env, setting_value, split_exec

API_KEY_ENV = "DDOPS_API_KEY"   # the operator's variable the shipped profiles read the key from


def api_key_of(env_text: str | None) -> str | None:
    """The API key an env file hands its service, under whichever runtime's variable it uses."""
    values = parse_env(env_text or "")
    return next((values[name] for name in API_KEY_VARS if values.get(name)), None)


def desired_from(rendered, profile_name: str) -> Desired:
    return Desired(rendered.unit_name, rendered.unit_path, rendered.unit_text, rendered.env_path,
                   rendered.env_text, profile_name, rendered.content_hash)


def gate_spec(profile, argv: list[str], host_address: str) -> GateSpec:
    method, launch = profile.method, read_launch(argv)
    runtime = RUNTIMES[profile.runtime]
    return GateSpec(
        base_url=endpoint(argv, host_address),
        model_path=launch.get("model.path") or profile.model.path,
        served_model=launch.get("model.served_name") or profile.model.served_name,
        algorithm=method.sglang_name,
        speculative=method.is_speculative,
        draft_path=launch.get("speculative.draft_model_path") if method.needs_draft else None,
        budget=launch.int("speculative.ddtree_budget") if method.uses_tree_budget else None,
        uses_tree_budget=method.uses_tree_budget,
        health_path=profile.health.path,
        generate_path=profile.health.generate_path if runtime.probe_route else None,
        identity=runtime.identity,
        acceptance=runtime.acceptance,
        max_model_len=profile.memory.context_length,
        timeout_s=float(profile.health.timeout_s),
        generate_timeout_s=float(profile.health.generate_timeout_s),
        messages=tuple(m.model_dump() for m in profile.smoke.messages),
        max_tokens=profile.smoke.max_tokens,
        temperature=profile.smoke.temperature,
        top_p=profile.smoke.top_p,
    )


def env_value(env_text: str | None, key: str) -> str | None:
    """A value of an env file as systemd hands it to the service (the one reader, unitsyntax)."""
    return parse_env(env_text or "").get(key)


def env_file_of(unit_text: str | None) -> str | None:
    """The path of the unit's EnvironmentFile= (its optional `-` dropped), None when it names none."""
    for line in (unit_text or "").splitlines():
        if line.startswith("EnvironmentFile="):
            return line.split("=", 1)[1].lstrip("-").strip()
    return None


def unit_argv(unit_text: str | None) -> list[str]:
    """ExecStart's command line from a unit file, as systemd hands it to the process."""
    line = setting_value(unit_text or "", "ExecStart")
    try:
        return split_exec(line) if line else []
    except ValueError:   # an unterminated quote in a hand-edited unit: no command line to read
        return []


def health_spec(unit_text: str | None, host_address: str, timeout_s: float) -> GateSpec | None:
    """Enough of a GateSpec to confirm a (restored) unit answers /health again."""
    argv = unit_argv(unit_text)
    if not argv:
        return None
    runtime = read_launch(argv).table
    return GateSpec(base_url=endpoint(argv, host_address), model_path="", served_model="",
                    algorithm=None, speculative=False, timeout_s=timeout_s,
                    generate_path=None if runtime is not None and not runtime.probe_route else "/health_generate")
