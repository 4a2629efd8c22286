"""Model facts from the hand-written configs in tests/fit/configs (published numbers)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ddops.fit import facts_from_config

CONFIGS = Path(__file__).resolve().parent / "configs"


def facts(name: str):
    return facts_from_config(json.loads((CONFIGS / name / "config.json").read_text()), str(CONFIGS / name))


@pytest.fixture(scope="session")
def qwen27b():
    return facts("Qwen3.6-27B")


@pytest.fixture(scope="session")
def qwen27b_draft():
    return facts("Qwen3.6-27B-DFlash")


@pytest.fixture(scope="session")
def qwen8b():
    return facts("Qwen3-8B")


@pytest.fixture(scope="session")
def qwen8b_draft():
    return facts("Qwen3-8B-DFlash-b16")


@pytest.fixture(scope="session")
def llama8b():
    return facts("Llama-3.1-8B-Instruct")
