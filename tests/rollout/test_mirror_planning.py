"""Mirroring's opt-in and planning refusals (docs/mirror.md): pure, no host contacted."""

import pytest
import yaml

from ddops.profile import load_profile
from ddops.profile.yamlfile import ConfigError
from ddops.rollout.shadow.mirrored import Mirrored, judge_mirrored, taps
from ddops.profile.analysis import MirrorRequirement
from ddops.render import command_line


def profile(tmp_path, base: str, **service):
    path = tmp_path / f"{base}-{len(service)}.yaml"
    path.write_text(yaml.safe_dump({"extends": base, "service": service}))
    return load_profile(str(path))


def test_opt_in_renders_the_flag_and_other_runtimes_are_refused(tmp_path):
    assert "--enable-mirror" in command_line(profile(tmp_path, "cpu-ar", mirror=True))
    assert "--enable-mirror" not in command_line(profile(tmp_path, "cpu-ar"))
    with pytest.raises(ConfigError, match="service.mirror.*runtime sglang has no flag"):
        profile(tmp_path, "a6000-base", mirror=True)
    assert taps("bundled") and not taps("sglang") and not taps("vllm")


def sink(requests: int, equality: float | None, accept: float | None) -> dict:
    return {"compared": requests, "received": requests, "dropped": 0, "failed": 0, "samples": [],
            "deterministic": {"token_equality": equality}, "distribution": {},
            "shadow": {"accept_length": accept}}


def test_requirement_checks_count_equality_and_accepted_length():
    need = MirrorRequirement(min_requests=16, min_token_equality=1.0, min_accept_length=2.0)
    assert judge_mirrored(Mirrored({}, sink(16, 1.0, 2.5)), need).passed
    failed = judge_mirrored(Mirrored({}, sink(15, 0.99, 1.5)), need)
    assert [c.name for c in failed.checks if not c.passed] == [
        "mirrored requests", "mirrored token equality", "mirrored accepted length"]
    assert not judge_mirrored(Mirrored({}, sink(20, None, None)), need).passed   # nothing deterministic


def test_compare_mirrored_with_nothing_listening_is_unreachable_not_a_crash(tmp_path, monkeypatch):
    import json

    from typer.testing import CliRunner

    from ddops.cli import app
    monkeypatch.setenv("DDOPS_STATE", str(tmp_path / "state"))
    dead = "http://127.0.0.1:9"          # discard port: nothing listens
    result = CliRunner().invoke(app, ["shadow", "compare", "--mirrored", "--json", "--production-url", dead,
                                      "--shadow-url", dead])
    assert result.exit_code == 6 and "production at http://127.0.0.1:9" in json.loads(result.stdout)["error"]
