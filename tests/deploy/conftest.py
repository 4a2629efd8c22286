"""Deploy tests run on the session's lab (`lab_hosts`); DDOPS_DEPLOY_TEST_INVENTORY points them
at a lab already up instead (while developing: `ddops lab up` once, then iterate)."""

import os
from pathlib import Path

import pytest

from tests.fixtures_lab import Lab


@pytest.fixture(scope="module")
def deploy_lab(request) -> Lab:
    inventory = os.environ.get("DDOPS_DEPLOY_TEST_INVENTORY")
    if not inventory:
        return request.getfixturevalue("lab_hosts")
    from ddops.inventory import load_inventory
    hosts = tuple(load_inventory(Path(inventory)).hosts)
    return Lab(Path(inventory), hosts, {"DDOPS_INVENTORY": inventory})
