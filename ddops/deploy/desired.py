"""From a loaded profile and its rendered unit to what deploy works with: the files the host
should hold (`Desired`) and what the gate should see (`GateSpec`). Capabilities come from
the METHODS table through `profile.method`; no method name is compared here."""

from __future__ import annotations

from ddops.deploy.gate import GateSpec, endpoint, flag_value
from ddops.deploy.plan import Desired
from ddops.unitsyntax import parse_env, setting_value, split_exec

API_KEY_ENV = "DDOPS_API_KEY"


def desired_from(rendered, profile_name: str) -> Desired:
    return Desired(rendered.unit_name, rendered.unit_path, rendered.unit_text, rendered.env_path,
                   rendered.env_text, profile_name, rendered.content_hash)


def gate_spec(profile, argv: list[str], host_address: str) -> GateSpec:
    method = profile.method
    model_path = flag_value(argv, "--model-path", "--model") or profile.model.path
    budget = flag_value(argv, "--speculative-ddtree-budget") if method.uses_tree_budget else None
    return GateSpec(
        base_url=endpoint(argv, host_address),
        model_path=model_path,
        served_model=flag_value(argv, "--served-model-name") or profile.model.served_name,
        algorithm=method.sglang_name,
        speculative=method.is_speculative,
        draft_path=(flag_value(argv, "--speculative-draft-model-path", "--speculative-draft-model")
                    if method.needs_draft else None),
        budget=int(budget) if budget else None,
        uses_tree_budget=method.uses_tree_budget,
        health_path=profile.health.path,
        generate_path=profile.health.generate_path,
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
    return GateSpec(base_url=endpoint(argv, host_address), model_path="", served_model="",
                    algorithm=None, speculative=False, timeout_s=timeout_s)
