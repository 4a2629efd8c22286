"""The mirror relay's unit on production's host (docs/mirror.md): for a production runtime
whose mirror source is its request logs (the runtime table's `mirror_source`), `ddops shadow
start --mirror` uploads the stdlib relay package (ddops/rollout/shadow/relay/), renders
templates/mirror-relay.service.j2 and starts it; `ddops shadow abort` removes it.
"""

from __future__ import annotations

from pathlib import Path

import jinja2

from ddops import __version__, systemd
from ddops.exits import BadInput
from ddops.render import ENV_DIR, UNIT_DIR, templates_dir
from ddops.unitsyntax import env_value, exec_word, setting, unsafe_text

PACKAGE = Path(__file__).resolve().parent / "relay"
LIB_DIR = "/usr/local/lib/ddops-mirror"     # holds the package as `relay/`
PYTHON = "/usr/bin/python3"
KEY_ENV = "DDOPS_MIRROR_KEY"                # relay/__main__.py reads it


def unit_name(production_unit: str) -> str:
    return f"{production_unit.removesuffix('.service')}-mirror-relay.service"


def port_for(production_port: int, shadow_port: int | None) -> int:
    """Loopback port of the relay's GET /mirror: production's port + 2, or + 3 when the shadow
    took that one on the same host."""
    return production_port + (3 if shadow_port == production_port + 2 else 2)


def render(production_unit: str, shadow_url: str, port: int, model: str | None,
           sample: float, key: str | None, dialect: str) -> dict[str, str]:
    """{path: text} of the relay's unit and env file; `dialect`: production's request logs'
    (the runtime table's `request_log`)."""
    name = unit_name(production_unit)
    env_path = f"{ENV_DIR}/{name.removesuffix('.service')}.env"
    argv = [PYTHON, "-m", "relay", "--unit", production_unit, "--url", shadow_url, "--port", str(port),
            "--format", dialect, "--sample", repr(float(sample))] + (["--model", model] if model else [])
    for value in (*argv, key or ""):
        reason = unsafe_text(value)
        if reason:
            raise BadInput(f"mirror relay: {value!r} {reason}")
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(templates_dir())),
                             undefined=jinja2.StrictUndefined, keep_trailing_newline=True, autoescape=False)
    env.filters["setting"] = setting
    unit = env.get_template("mirror-relay.service.j2").render(
        version=__version__, production_unit=production_unit, shadow_url=shadow_url, env_path=env_path,
        lib_dir=LIB_DIR, exec_start=" ".join(exec_word(a) for a in argv))
    secret = f"{KEY_ENV}={env_value(key)}\n" if key else ""
    return {f"{UNIT_DIR}/{name}": unit, env_path: f"# ddops mirror relay: the shadow's API key\n{secret}"}


def install(remote, files: dict[str, str]) -> str:
    """Upload the package and the unit, start it; the unit's name."""
    remote.run(f"test -x {PYTHON} || {{ echo '{PYTHON}: no python3 on this host for the mirror relay' >&2; exit 1; }}")
    for source in sorted(PACKAGE.glob("*.py")):
        remote.write(f"{LIB_DIR}/relay/{source.name}", source.read_text(encoding="utf-8"))
    (unit_path, unit_text), (env_path, env_text) = files.items()
    remote.write(env_path, env_text, mode=0o600)
    remote.write(unit_path, unit_text)
    name = Path(unit_path).name
    remote.run(f"{systemd.daemon_reload()} && {systemd.restart(name)}")
    return name


def remove(remote, production_unit: str) -> None:
    """Best effort: stop and delete the relay's unit and env file (the package stays)."""
    name = unit_name(production_unit)
    remote.run(systemd.remove(name, f"{UNIT_DIR}/{name}", f"{ENV_DIR}/{name.removesuffix('.service')}.env"),
               check=False)
