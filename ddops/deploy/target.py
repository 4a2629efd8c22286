"""Everything a deploy needs before it touches a host, loaded once: the profile, the host,
the rendered unit and env file (with secrets read on this machine), and the gate spec.
Any problem here is bad input (exit 2) and nothing has been contacted yet."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pydantic import TypeAdapter, ValidationError

from ddops.deploy.desired import desired_from, gate_spec
from ddops.deploy.gate import GateSpec
from ddops.deploy.plan import Desired
from ddops.inventory import Host, load_inventory
from ddops.profile import Profile, load_profile
from ddops.profile.schema import Port
from ddops.profile.yamlfile import ConfigError
from ddops.render import Rendered, render, resolve_secrets


def check_port(port: int) -> None:
    """--port obeys the rule of the profile's service.port (schema.Port), checked before rendering."""
    try:
        TypeAdapter(Port).validate_python(port)
    except ValidationError:
        raise ConfigError([f"--port {port}: not a TCP port (1-65535, the range of service.port)"]) from None


@dataclass(frozen=True)
class Target:
    profile: Profile
    host: Host
    rendered: Rendered
    desired: Desired
    spec: GateSpec


def load_target(profile_name: str, host_name: str, *, profiles_dir: Path | None = None,
                inventory: Path | None = None, unit_name: str | None = None,
                port: int | None = None) -> Target:
    """Raises ProfileError / InventoryError / RenderError (all ConfigError) on bad input."""
    if port is not None:
        check_port(port)
    profile = load_profile(profile_name, profiles_dir)
    host = load_inventory(inventory).host(host_name)
    rendered = render(profile, host, unit_name=unit_name, port=port, secrets=resolve_secrets(profile))
    return Target(profile, host, rendered, desired_from(rendered, profile.name),
                  gate_spec(profile, rendered.argv, host.address))
