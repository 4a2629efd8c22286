"""docs/ci-example.yml stays runnable: every `ddops` command it runs exists with the options
it passes, its default plan file is a valid plan whose profile loads, and every secret the
plan and the profile read from the environment is set by the workflow."""

import re
from pathlib import Path

import yaml

from ddops.profile import load_profile
from ddops.rollout.fleet.waves import load_plan
from tests.ops.test_cli_shell import _alternatives, is_group, resolve

REPO = Path(__file__).resolve().parents[2]
WORKFLOW = yaml.safe_load((REPO / "docs/ci-example.yml").read_text())


def commands() -> list[list[str]]:
    """`ddops ...` invocations of the workflow's run steps, continuation lines joined."""
    found = []
    for job in WORKFLOW["jobs"].values():
        for step in job["steps"]:
            script = re.sub(r"\$\{\{.*?\}\}", "EXPR", step.get("run", "").replace("\\\n", " "))
            found += [m.split() for m in re.findall(r"(?:^|[\s;&|(])(ddops [^\n;|&>)]*)", script)]
    return found


def test_every_ddops_command_of_the_workflow_exists_with_its_options():
    invocations = commands()
    assert {c[1] for c in invocations} >= {"shadow", "rollout", "report", "validate"}
    for words in invocations:
        for alternative in _alternatives(words[1:]):
            command, rest = resolve(alternative)
            assert not is_group(command), f"{' '.join(words)}: names a group, not a command"
            known = {o for p in command.params for o in getattr(p, "opts", [])} | {"--help"}
            assert [w for w in rest if w.startswith("-") and w not in known] == [], " ".join(words)


def test_default_plan_is_valid_and_its_secrets_come_from_the_workflow():
    plan_path = WORKFLOW[True]["workflow_dispatch"]["inputs"]["plan"]["default"]  # YAML 1.1: `on` is True
    plan = load_plan(REPO / plan_path)
    profile = load_profile(plan.profile)
    assert plan.analysis is not None and plan.pause_after == ("canary",)
    env = WORKFLOW["env"]
    needed = {hook["url_env"] for hook in plan.notify if "url_env" in hook}
    needed |= {profile.service.secrets.api_key_env} - {None}
    assert needed and needed <= set(env)
    assert all("secrets." in env[name] for name in needed)
