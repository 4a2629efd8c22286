"""Shared test set-up. Fixture plugins live beside their owners' tests."""

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
CACHE = Path(os.environ.get("DDOPS_CACHE", "/var/cache/ddops"))


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO


@pytest.fixture(scope="session")
def cache_dir() -> Path:
    return CACHE

pytest_plugins = ["tests.fixtures_lab"]
