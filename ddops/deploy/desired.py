"""From a loaded profile and its rendered unit to what deploy works with: the files the host
should hold (`Desired`) and what the gate should see (`GateSpec`). Capabilities come from
the METHODS table through `profile.method`; no method name is compared here."""

from __future__ import annotations

from ddops.deploy.gate import GateSpec, endpoint
from ddops.deploy.plan import Desired
from ddops.profile.launch import read_launch
from ddops.profile.methods import method_for, reported_algorithm
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


def gate_spec(profile, argv: list[str], host_address: str, timeout_s: float | None = None) -> GateSpec:
    """The one GateSpec builder: what the unit's command line says it serves (read back by the
    runtime tables, launch.py), with the profile's health and smoke settings where one is known.
    Without a profile (a hand-written unit, a restored backup, a unit restarted after a refused
    switch) the GateSpec's defaults stand in. timeout_s: the health wait, instead of the profile's."""
    launch = read_launch(argv)
    runtime = RUNTIMES[profile.runtime] if profile else launch.table
    method = profile.method if profile else method_for(launch.method or "none")
    model = launch.get("model.path") or (profile.model.path if profile else "")
    probe = runtime is None or runtime.probe_route
    settings = _profile_settings(profile) if profile else {}
    if timeout_s is not None:
        settings["timeout_s"] = float(timeout_s)
    return GateSpec(
        base_url=endpoint(argv, host_address),
        model_path=model,
        served_model=launch.get("model.served_name") or (profile.model.served_name if profile
                                                         else model.rstrip("/").rsplit("/", 1)[-1]),
        algorithm=(method.sglang_name if profile or launch.method
                   else reported_algorithm(launch.get("speculative.algorithm"))),
        speculative=method.is_speculative,
        draft_path=launch.get("speculative.draft_model_path") if method.needs_draft else None,
        budget=launch.int("speculative.ddtree_budget") if method.uses_tree_budget else None,
        uses_tree_budget=method.uses_tree_budget,
        generate_path=(profile.health.generate_path if profile else GateSpec.generate_path) if probe else None,
        **({"identity": runtime.identity, "acceptance": runtime.acceptance} if runtime else {}),
        max_model_len=profile.memory.context_length if profile else launch.int("memory.context_length"),
        **settings,
    )


def _profile_settings(profile) -> dict:
    """The gate's settings only a profile says (health path and waits, the smoke request)."""
    return {"health_path": profile.health.path, "timeout_s": float(profile.health.timeout_s),
            "generate_timeout_s": float(profile.health.generate_timeout_s),
            "messages": tuple(m.model_dump() for m in profile.smoke.messages),
            "max_tokens": profile.smoke.max_tokens, "temperature": profile.smoke.temperature,
            "top_p": profile.smoke.top_p}


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
    """The gate of a unit known only by its file (a restored backup): /health, then the probe
    route where its runtime has one, within timeout_s. None when the file has no command line."""
    argv = unit_argv(unit_text)
    return gate_spec(None, argv, host_address, timeout_s) if argv else None
