"""Small helpers for the ops tests: write profile files into a temp folder."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from ddops.profile import ProfileError, load_profile

REPO = Path(__file__).resolve().parents[2]
SHIPPED = REPO / "profiles"

# A minimal valid bundled profile; tests extend or replace parts of it.
BASE = """\
runtime: bundled
model:
  path: /var/lib/ddops/models/tiny-llama
  served_name: tiny-llama
"""


def write(folder: Path, name: str, text: str) -> Path:
    path = folder / f"{name}.yaml"
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


def problems_of(folder: Path, name: str) -> list[str]:
    with pytest.raises(ProfileError) as caught:
        load_profile(name, folder)
    assert caught.value.problems, "a ProfileError always carries problems"
    return caught.value.problems


def only_problem(folder: Path, name: str) -> str:
    problems = problems_of(folder, name)
    assert len(problems) == 1, problems
    return problems[0]
