"""Shared test set-up. Fixture plugins live beside their owners' tests."""

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
CACHE = Path(os.environ.get("DDOPS_CACHE", "/var/cache/ddops"))
# The shipped cpu-* profiles require an API key from $DDOPS_API_KEY; every test (and every
# `ddops` it starts) deploys with this one unless it sets its own.
TEST_API_KEY = os.environ.setdefault("DDOPS_API_KEY", "ddops-test-key-7f3a")


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO


@pytest.fixture(scope="session")
def cache_dir() -> Path:
    return CACHE

pytest_plugins = ["tests.fixtures_lab"]
