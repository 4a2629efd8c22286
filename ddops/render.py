"""Profile (+ host) -> the exact systemd unit and env file a host runs. Pure: no I/O besides
reading templates, so the same profile always renders the same bytes.

The unit header carries facts the deploy engine reads back from a host:
`# ddops-profile: NAME`, `# ddops-hash: SHA256`, `# ddops-version: V`. The hash covers the
unit (with the hash line zeroed) and the env file without secret values, so it changes when
anything but a secret changes.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import jinja2

from ddops import __version__
from ddops.inventory import Host
from ddops.profile import METHODS, RUNTIMES, Profile
from ddops.profile.extra_args import args_of
from ddops.profile.rules import value_at
from ddops.profile.runtimes import Flag
from ddops.profile.sglang_versions import Flags, flags_for, spell
from ddops.profile.yamlfile import ConfigError
from ddops.unitsyntax import env_value, exec_word, parse_env, path_word, setting, setting_value, \
    split_exec, unsafe_text

REPO_TEMPLATES = Path(__file__).resolve().parent.parent / "templates"
UNIT_DIR = "/etc/systemd/system"
ENV_DIR = "/etc/ddops"
ZERO_HASH = "0" * 64
HEADER = re.compile(r"^# ddops-(profile|hash|version): (\S+)$", re.MULTILINE)


class RenderError(ConfigError):
    """The profile cannot be rendered for this host or with these secrets."""


@dataclass(frozen=True)
class Rendered:
    unit_name: str  # "llm.service"
    unit_path: str  # "/etc/systemd/system/llm.service"
    unit_text: str
    env_path: str  # "/etc/ddops/llm.env", written with mode 0600
    env_text: str  # holds secret values when secrets were given
    argv: list[str]  # ExecStart as a list; never a secret value
    content_hash: str  # the ddops-hash header value


def templates_dir() -> Path:
    return Path(os.environ.get("DDOPS_TEMPLATES") or REPO_TEMPLATES)


@functools.lru_cache(maxsize=4)
def _jinja(folder: str) -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(folder), undefined=jinja2.StrictUndefined,
                             keep_trailing_newline=True, autoescape=False)
    env.filters["setting"] = setting  # every value in a plain setting: specifiers escaped
    return env


def render(profile: Profile, host: Host | None = None, *, unit_name: str | None = None,
           port: int | None = None, secrets: Mapping[str, str] | None = None) -> Rendered:
    """Render the unit and env file; raises RenderError naming what does not fit."""
    if host is not None:
        _check_host(profile, host)
    unit = _unit_name(unit_name or profile.service.unit)
    stem = unit.removesuffix(".service")
    env_path = f"{ENV_DIR}/{stem}.env"
    args = command_line(profile, port=port, unit=unit)
    context = _context(profile, unit, stem, env_path, args)
    env_public = _render("env.j2", context, secret_lines=_secret_lines(profile, None))
    env_text = _render("env.j2", context, secret_lines=_secret_lines(profile, secrets))
    template = RUNTIMES[profile.runtime].template
    draft = _render(template, context, content_hash=ZERO_HASH)
    digest = content_hash(draft, env_public)
    unit_text = draft.replace(f"# ddops-hash: {ZERO_HASH}", f"# ddops-hash: {digest}", 1)
    _read_back(unit_text, env_text, args, profile, secrets or {})
    return Rendered(unit, f"{UNIT_DIR}/{unit}", unit_text, env_path, env_text, args, digest)


def _read_back(unit_text: str, env_text: str, args: list[str], profile: Profile,
               secrets: Mapping[str, str]) -> None:
    """The written files read back (unitsyntax's readers, systemd's rules) as exactly the
    values rendered, or no files at all: a value that would change meaning is a RenderError."""
    exec_line = setting_value(unit_text, "ExecStart")
    wanted_env = {**profile.service.environment, **secrets}
    found = []
    if split_exec(exec_line or "") != args:
        found.append(f"profile {profile.name}: ExecStart= would not read back as the command line")
    if parse_env(env_text) != wanted_env:
        found.append(f"profile {profile.name}: the env file would not read back as the environment")
    if found:
        raise RenderError(found)


def content_hash(unit_text_zeroed: str, env_public: str) -> str:
    return hashlib.sha256(f"{unit_text_zeroed}\0{env_public}".encode()).hexdigest()


def read_header(unit_text: str) -> dict[str, str]:
    """The ddops facts in a unit's header: {"profile", "hash", "version"} (those present)."""
    return {key: value for key, value in HEADER.findall(unit_text)}


def command_line(profile: Profile, *, port: int | None = None, unit: str | None = None) -> list[str]:
    """`<python> -m <runtime module> <flags>`, walking the runtime's flag table in order, each
    flag spelled as the profile's declared SGLang version spells it; the table's `json` rows
    make one JSON argument where the first of them stands. A runtime that takes its key from a
    config file gets `--config <file>`: a path, never the key."""
    runtime = RUNTIMES[profile.runtime]
    spelling = _spelling(profile)
    args = [profile.service.python, "-m", runtime.module]
    for flag in runtime.flags:
        value = port if (flag.key == "service.port" and port is not None) else value_at(profile, flag.key)
        if flag.style == "json":
            args += _json_args(profile, runtime, flag, args)
        else:
            args += spell(spelling, _flag_args(runtime, flag, value))
    if runtime.api_key_via == "config_file" and profile.service.secrets.has_api_key:
        args += ["--config", key_config_path(_unit_name(unit or profile.service.unit))]
    return args + args_of(profile)   # unmodelled flags, as written (profile/extra_args.py)


def _json_args(profile: Profile, runtime, flag: Flag, args: list[str]) -> list[str]:
    """`--flag {"field": value, ...}` from every json row of `flag.flag`, once (at its first row),
    and only for a speculative method; keys in table order, compact, so the bytes are stable."""
    if flag.flag in args or not profile.method.is_speculative:
        return []
    fields = {}
    for row in (f for f in runtime.flags if f.style == "json" and f.flag == flag.flag):
        value = value_at(profile, row.key)
        if row.key == "speculative.algorithm":
            value = runtime.method_name(METHODS[value])
        elif isinstance(value, int) and not isinstance(value, bool):
            value += row.offset
        if value is not None:
            fields[row.field] = value
    return [flag.flag, json.dumps(fields, separators=(",", ":"))]


def key_config_path(unit: str) -> str:
    """Where ExecStartPre= writes the key for a runtime that reads it from a config file: the
    unit's RuntimeDirectory= (mode 0700, its user's, removed when the service stops)."""
    return f"/run/{unit.removesuffix('.service')}/api-key.yaml"


def _spelling(profile: Profile) -> Flags | None:
    """The declared version's flags; None keeps the table's spelling (no version declared).
    Validation has already rejected a version string the table cannot place."""
    if profile.sglang_version is None or not RUNTIMES[profile.runtime].versioned_flags:
        return None
    return flags_for(profile.sglang_version)


def _flag_args(runtime, flag: Flag, value: object) -> list[str]:
    if flag.style == "unit":
        return []
    if flag.style == "method":
        name = runtime.method_name(METHODS[value])
        return [flag.flag, name] if name else []
    if flag.style == "switch":
        on = value == flag.when if flag.when is not None else value
        return ([flag.flag] + ([flag.value] if flag.value else [])) if on else []
    if flag.style == "off_switch":
        return [] if value else [flag.flag]
    return [] if value is None else [flag.flag, str(value)]


def _unit_name(name: str) -> str:
    unit = name if name.endswith(".service") else f"{name}.service"
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.@-]*\.service", unit):
        raise RenderError([f"unit name {name!r}: not a valid systemd service name"])
    return unit


def _check_host(profile: Profile, host: Host) -> None:
    runtime, gpu = RUNTIMES[profile.runtime], host.gpu
    wants_gpu = runtime.wants_gpu(profile.service.device)
    problems = []
    if wants_gpu and gpu is None:
        problems.append(f"host {host.name}: profile {profile.name} needs a GPU; the inventory lists none")
    if gpu is not None and profile.model.tp_size > gpu.count:
        problems.append(f"host {host.name}: profile {profile.name} has model.tp_size "
                        f"{profile.model.tp_size}, the host has {gpu.count} GPU(s)")
    if problems:
        raise RenderError(problems)


def _secret_lines(profile: Profile, secrets: Mapping[str, str] | None) -> list[tuple[str, str | None]]:
    declared = [api_key_var(profile)] if profile.service.secrets.has_api_key else []
    if secrets is None:
        return [(name, None) for name in declared]
    extra = sorted(set(secrets) - set(declared))
    missing = [name for name in declared if name not in secrets]
    bad = {name: _secret_problem(secrets[name]) for name in declared if name in secrets}
    problems = [f"secret {n}: not declared by profile {profile.name}" for n in extra]
    problems += [f"secret {n}: required by profile {profile.name}, not given" for n in missing]
    problems += [f"secret {n}: {reason}" for n, reason in bad.items() if reason]
    if problems:
        raise RenderError(problems)
    return [(name, env_value(secrets[name])) for name in declared]


def _secret_problem(value: str) -> str | None:
    """Why a secret cannot be written (never quoting the value)."""
    if not value:
        return "is empty"
    reason = unsafe_text(value)
    return reason.split(" (")[0] if reason else None


def _context(profile: Profile, unit: str, stem: str, env_path: str, args: list[str]) -> dict:
    service = profile.service
    method = profile.method
    return dict(
        profile=profile, service=service, version=__version__, unit_name=unit, unit_stem=stem,
        env_path=env_path, exec_start=exec_start(args), read_write=path_word(service.working_dir),
        key_writer=_key_writer(profile, unit, args),
        models_label="target and draft" if method.needs_draft else "the model",
        api_key_ref=service.secrets.has_api_key,
        method_label=profile.speculative.algorithm if method.is_speculative else "plain decoding",
        start_limit_interval_s=service.start_limit_burst * (service.start_timeout_s + service.restart_sec),
        environment=[(k, env_value(v)) for k, v in sorted(service.environment.items())],
        secret_sources={api_key_var(profile): _secret_source(profile)},
    )


def _secret_source(profile: Profile) -> str:
    secrets = profile.service.secrets
    return f"${secrets.api_key_env}" if secrets.api_key_env else "service.secrets.api_key_file"


# Run by ExecStartPre= as the service's user: the key from the environment (EnvironmentFile=)
# into a 0600 YAML file (JSON is YAML) that SGLang's --config reads, so it is not in argv.
KEY_WRITER = ("import json, os, sys; "
              "fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600); "
              "os.write(fd, json.dumps({'api-key': os.environ['" + RUNTIMES["sglang"].api_key_env + "']}).encode()); "
              "os.close(fd)")


def api_key_var(profile: Profile) -> str:
    """The env file variable that carries the API key: the one the runtime reads."""
    return RUNTIMES[profile.runtime].api_key_env


def _key_writer(profile: Profile, unit: str, args: list[str]) -> str | None:
    if "--config" not in args:
        return None
    return " ".join(exec_word(w) for w in (profile.service.python, "-c", KEY_WRITER, key_config_path(unit)))


def _render(template: str, context: dict, **extra: object) -> str:
    return _jinja(str(templates_dir())).get_template(template).render(**context, **extra)


def exec_start(args: list[str]) -> str:
    """ExecStart value, one flag (with its value) per continued line so diffs read per flag."""
    words = [exec_word(arg) for arg in args]
    lines = [" ".join(words[:3])]  # <python> -m <module>
    for arg, word in zip(args[3:], words[3:]):
        if arg.startswith("--"):
            lines.append(word)
        else:
            lines[-1] += f" {word}"
    return " \\\n    ".join(lines)


def resolve_secrets(profile: Profile, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Read the API key from where the profile says (an env var or a local file). I/O edge."""
    secrets = profile.service.secrets
    environ = os.environ if environ is None else environ
    if secrets.api_key_env:
        value = environ.get(secrets.api_key_env)
        if not value:
            raise RenderError([f"profile {profile.name}: service.secrets.api_key_env: "
                               f"${secrets.api_key_env} is not set (export the API key there)"])
        return {api_key_var(profile): value}
    if secrets.api_key_file:
        try:
            value = Path(secrets.api_key_file).read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise RenderError([f"profile {profile.name}: service.secrets.api_key_file: "
                               f"cannot read {secrets.api_key_file}: {exc.strerror or exc}"]) from None
        return {api_key_var(profile): value}
    return {}
