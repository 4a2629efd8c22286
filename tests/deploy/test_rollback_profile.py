"""Which profile a rollback predicts fit with: the entry's, only while it renders the entry's unit
exactly (the lab test in test_lab_refuse.py runs the refusal on a real host)."""

from __future__ import annotations

import json
from pathlib import Path

from ddops.deploy.history import Entry, Record
from ddops.deploy.rollback import profile_of
from ddops.inventory import Gpu, Host
from ddops.profile import load_profile
from ddops.render import render

PROFILES = Path(__file__).parent / "profiles"
HOST = Host(name="g1", address="10.0.0.5", gpu=Gpu(kind="RTX A6000", count=1, memory_gb=48))


def entry_for(name: str, **change) -> tuple[Entry, str]:
    rendered = render(load_profile(name, PROFILES), HOST, unit_name="ddx.service", port=30110)
    meta = {"profile": name, "hash": rendered.content_hash, **change}
    return Entry("ddx.service", "0003-20260101T000000Z", Record.from_json(json.dumps(meta), "ddx.service")), \
        rendered.unit_text


def test_the_entrys_profile_is_used_while_it_renders_the_same_unit():
    entry, unit = entry_for("sglang-tiny-nofit")
    profile, why = profile_of(entry, unit, HOST, PROFILES)
    assert profile is not None and profile.name == "sglang-tiny-nofit" and why is None


def test_a_changed_or_missing_profile_is_named_instead_of_guessed():
    changed, unit = entry_for("sglang-tiny-nofit", hash="0" * 64)
    assert profile_of(changed, unit, HOST, PROFILES) == (None, "profile sglang-tiny-nofit has changed since entry 0003 was deployed")
    gone, why = profile_of(changed, unit, HOST, PROFILES.parent)
    assert gone is None and "cannot be rendered here" in why and "sglang-tiny-nofit" in why
    unnamed, _ = entry_for("sglang-tiny-nofit", profile="?")
    assert profile_of(unnamed, unit, HOST, PROFILES) == (None, "entry 0003 names no profile")
