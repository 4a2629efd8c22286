"""The tiny llama and its distilled draft (cached under $DDOPS_CACHE/models), as the speculative
tests build them, for a real runtime to scrape."""

import pytest

from serving.tools.tiny import write_tiny
from tests.speculative.conftest import cached_distilled_draft


@pytest.fixture(scope="module")
def tiny_dirs(tmp_path_factory) -> dict:
    return {"llama": write_tiny(tmp_path_factory.mktemp("tiny") / "llama", "llama")}


@pytest.fixture(scope="module")
def distilled_drafts(tiny_dirs, cache_dir) -> dict:
    return {"llama": cached_distilled_draft(tiny_dirs["llama"], cache_dir, "llama")}
