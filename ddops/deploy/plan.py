"""Plan: desired files + host facts -> ordered steps and unified diffs. Pure.

The steps are the program: `apply` executes exactly these, in this order, and nothing else;
a systemctl step carries the exact command it runs (spelled by ddops.systemd), so what
`--dry-run` shows is what runs.

Secrets never leave this module unmasked: env-file values whose key names a secret
(KEY, TOKEN, SECRET, PASSWORD) are shown as *** on both sides of the diff.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass

from ddops import systemd
from ddops.deploy.facts import Facts

SECRET_KEY = re.compile(r"(KEY|TOKEN|SECRET|PASSWORD|PASSWD)", re.IGNORECASE)


@dataclass(frozen=True)
class Desired:
    """What the host should hold for one unit (from `ddops.render.render`)."""
    unit_name: str
    unit_path: str
    unit_text: str
    env_path: str
    env_text: str
    profile: str
    profile_hash: str


@dataclass(frozen=True)
class Step:
    action: str     # recover | backup | write-unit | write-env | reload-enable | restart | gate | record
    detail: str
    command: str | None = None  # the shell text apply runs on the host for this step, when it is one

    def as_dict(self) -> dict:
        return {"action": self.action, "detail": self.detail, "command": self.command}


@dataclass(frozen=True)
class Plan:
    desired: Desired
    changed: bool           # files differ: the service will be restarted
    start_needed: bool      # files identical but the service is not running
    unit_diff: str
    env_diff: str
    steps: tuple[Step, ...]
    refusals: tuple = ()    # knowable.Refusal: definite reasons the new unit cannot start

    @property
    def noop(self) -> bool:
        return not self.steps

    @property
    def refused(self) -> bool:
        """Knowably bad and it would restart the service: stop before touching the host."""
        return bool(self.refusals) and (self.changed or self.start_needed)

    def as_dict(self) -> dict:
        return {"unit": self.desired.unit_name, "profile": self.desired.profile,
                "changed": self.changed, "start_needed": self.start_needed,
                "unit_diff": self.unit_diff, "env_diff": self.env_diff,
                "steps": [s.as_dict() for s in self.steps],
                "refusals": [r.as_dict() for r in self.refusals]}


def mask_env(text: str | None) -> list[str]:
    lines = []
    for line in (text or "").splitlines(keepends=True):
        key, sep, _ = line.partition("=")
        secret = sep and SECRET_KEY.search(key) and not line.lstrip().startswith("#")
        lines.append(f"{key}=***\n" if secret else line)
    return lines


def changed_secrets(old: str | None, new: str) -> list[str]:
    parse = lambda t: dict(l.split("=", 1) for l in (t or "").splitlines() if "=" in l)  # noqa: E731
    before, after = parse(old), parse(new)
    return sorted(k for k in set(before) | set(after)
                  if SECRET_KEY.search(k) and before.get(k) != after.get(k))


def unified(old_lines: list[str], new_lines: list[str], path: str, existed: bool) -> str:
    before = f"a{path}" if existed else "/dev/null"
    return "".join(difflib.unified_diff(old_lines, new_lines, before, f"b{path}"))


def make_plan(desired: Desired, facts: Facts, refusals=()) -> Plan:
    unit_changed = facts.unit_text != desired.unit_text
    env_changed = facts.env_text != desired.env_text
    changed = unit_changed or env_changed
    running = facts.state.active in ("active", "activating", "reloading")
    start_needed = not changed and not running
    unit_diff = unified((facts.unit_text or "").splitlines(keepends=True),
                        desired.unit_text.splitlines(keepends=True),
                        desired.unit_path, facts.unit_text is not None) if unit_changed else ""
    env_diff = _env_diff(desired, facts) if env_changed else ""
    return Plan(desired, changed, start_needed, unit_diff, env_diff,
                tuple(_steps(desired, facts, changed, start_needed)), tuple(refusals))


def _env_diff(desired: Desired, facts: Facts) -> str:
    diff = unified(mask_env(facts.env_text), mask_env(desired.env_text), desired.env_path,
                   facts.env_text is not None)
    secrets = changed_secrets(facts.env_text, desired.env_text)
    if secrets:
        diff += f"# secret value changed: {', '.join(secrets)}\n"
    return diff


def _command(action: str, command: str) -> Step:
    return Step(action, command, command)


def _steps(desired: Desired, facts: Facts, changed: bool, start_needed: bool) -> list[Step]:
    steps = []
    if facts.pending:
        steps.append(Step("recover", f"finish off the unfinished deploy of "
                                     f"{facts.pending.get('profile')} (restore its backup)"))
    if not (changed or start_needed):
        return steps
    name = desired.unit_name
    if changed:
        steps.append(Step("backup", f"keep the current unit and env file of {name} for revert"
                          if facts.unit_text is not None else f"note that {name} is new: a revert removes it"))
        steps.append(Step("write-unit", desired.unit_path))
        steps.append(Step("write-env", f"{desired.env_path} (mode 0600)"))
        steps.append(_command("reload-enable", systemd.reload_and_enable(name)))
    steps.append(_command("restart", systemd.restart(name)))
    steps.append(Step("gate", "health, health_generate, smoke request, server_info, acceptance"))
    steps.append(Step("record", f"history entry for {desired.profile} ({desired.profile_hash})"))
    return steps
