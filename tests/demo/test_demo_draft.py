"""Which draft `ddops demo` deploys, and where the profile's host finds it: `make drafter`'s when
it is trained, else the demo's short run, pushed to the path the profile names (the demo's DDTree
deploy once depended on `make drafter` having run; a draft pushed beside the path the profile reads
would fail the deploy's preflight)."""

from __future__ import annotations

import json

import pytest

from ddops.commands import demo
from ddops.profile.loader import load_profile
from serving.tools.drafter.__main__ import parse


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("DDOPS_CACHE", str(tmp_path))
    return tmp_path


def finish(cache, name: str) -> None:
    (cache / "models" / name).mkdir(parents=True)
    (cache / "models" / name / "config.json").write_text(json.dumps({}))


def test_without_make_drafter_the_demo_trains_and_pushes_its_own_draft_to_the_profiles_path(cache):
    profile = load_profile(demo.PROFILE)
    assert demo.draft_name() == demo.DEMO_DRAFT
    assert demo.pushes(profile) == [(cache / "models" / demo.TARGET, profile.model.path),
                                    (cache / "models" / demo.DEMO_DRAFT, profile.speculative.draft_model_path)]


def test_make_drafters_draft_is_taken_once_it_is_trained(cache):
    finish(cache, demo.DEMO_DRAFT)
    finish(cache, demo.DRAFT)
    profile = load_profile(demo.PROFILE)
    assert demo.pushes(profile)[1] == (cache / "models" / demo.DRAFT, profile.speculative.draft_model_path)
    assert demo.start_draft() is None


def test_the_demos_drafter_command_is_one_the_drafter_accepts(cache):
    command = demo.draft_command()
    args = parse(command[3:])
    assert (args.minutes, args.prompts) == (demo.DEMO_MINUTES, demo.DEMO_PROMPTS)
    assert args.out == cache / "models" / demo.DEMO_DRAFT and args.target == cache / "models" / demo.TARGET
