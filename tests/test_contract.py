"""The one place both sides meet (docs/contracts.md sections 1 and 2): every command line ddops
renders for the bundled runtime is one the runtime accepts, with the values the profile meant;
and ddops's readiness gate passes on the runtime started from a rendered DDTree unit.

`ddops` and `serving` never import each other; only this test imports both.
"""

from __future__ import annotations

import pytest

from ddops.deploy.desired import api_key_of, gate_spec
from ddops.deploy.facts import UnitState
from ddops.deploy.gate import run_gate
from ddops.profile import list_profiles, load_profile
from ddops.render import render, resolve_secrets
from serving.config import parse_args
from tests.hybrid.models import hybrid_pair
from tests.rollout import lab_models
from tests.server_process import ServerProcess

BUNDLED = [name for name in list_profiles() if load_profile(name).runtime == "bundled"]
# Flags whose values are this machine's, not the lab host's: the test sets them itself.
LOCAL_FLAGS = ("--model-path", "--speculative-draft-model-path", "--host", "--port", "--device")


def runtime_flags(argv: list[str]) -> list[str]:
    """The flags after `<python> -m serving`."""
    assert argv[1:3] == ["-m", "serving"], argv
    return argv[3:]


def without(flags: list[str], names: tuple[str, ...]) -> list[str]:
    out, skip = [], False
    for flag in flags:
        if skip:
            skip = False
        elif flag in names:
            skip = True
        else:
            out.append(flag)
    return out


def test_the_shipped_profiles_include_bundled_ones_of_every_kind():
    methods = {load_profile(name).method.is_speculative for name in BUNDLED}
    assert methods == {True, False}


@pytest.mark.parametrize("name", BUNDLED)
def test_every_rendered_bundled_command_line_parses_in_the_runtime(name):
    profile = load_profile(name)
    args = parse_args(runtime_flags(render(profile).argv), environ={})
    assert args.model_path == profile.model.path
    assert args.served_model_name == profile.model.served_name
    assert args.port == profile.service.port
    assert args.context_length == profile.memory.context_length
    assert args.public()["speculative_algorithm"] == profile.method.sglang_name
    assert (args.speculative_draft_model_path is not None) == profile.method.needs_draft
    assert (args.speculative_ddtree_budget is not None) == profile.method.uses_tree_budget
    assert args.api_key is None  # secrets travel in the env file, never on the command line


def test_the_gate_passes_on_the_runtime_started_from_a_rendered_ddtree_unit(tmp_path, cache_dir):
    models = lab_models.build(cache_dir)
    gate_on_rendered("cpu-ddtree", models["tiny-llama"], models["tiny-llama-dflash"], tmp_path)


def test_the_gate_passes_on_the_rendered_hybrid_ddtree_unit(tmp_path, cache_dir):
    """The Qwen3.5-layout hybrid (Gated DeltaNet) target with its DFlash draft under DDTree."""
    gate_on_rendered("cpu-hybrid-ddtree", *hybrid_pair(cache_dir), tmp_path)


def gate_on_rendered(name: str, target, draft, tmp_path) -> None:
    profile = load_profile(name)
    rendered = render(profile, secrets=resolve_secrets(profile))   # the key, as deploy writes it
    flags = without(runtime_flags(rendered.argv), LOCAL_FLAGS)
    flags += ["--speculative-draft-model-path", str(draft)]
    key = api_key_of(rendered.env_text)
    server = ServerProcess(target, tmp_path / "server.log", *flags, api_key=key)
    argv = ["python", "-m", "serving", "--model-path", str(target),
            "--host", "127.0.0.1", "--port", str(server.port), *flags]

    def watch() -> UnitState:  # the process stands in for the unit systemd would watch
        alive = server.process.poll() is None
        return UnitState("loaded", "active" if alive else "failed", "running" if alive else "dead")

    try:
        # the runtime reads DDOPS_API_KEY from its environment (given here, EnvironmentFile=
        # under systemd); the gate sends what the env file holds, as apply does
        report = run_gate(gate_spec(profile, argv, "127.0.0.1"), watch, api_key=key)
    finally:
        server.stop()
    assert report.passed, report.as_dict()
    assert [c.name for c in report.checks] == ["health", "generate", "smoke", "server_info", "acceptance"]
