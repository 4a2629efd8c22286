"""Mirroring on real lab hosts, through the `ddops` CLI (docs/mirror.md): production (plain,
opted in with service.mirror) on lab-1, a DDTree shadow on lab-2; 16 greedy client requests
to production are compared on the shadow token by token. Reuses test_lab_rollout's hosts and
twisted profiles (its module fixture)."""

from __future__ import annotations

import time

import httpx
import pytest

from tests.conftest import TEST_API_KEY
from tests.rollout.test_lab_rollout import lab, write  # noqa: F401 (the module fixture)

pytestmark = pytest.mark.lab
FIZZ = "Write a Python function that prints FizzBuzz for the numbers 1 to {}."


def test_sixteen_greedy_requests_are_mirrored_and_equal(lab):  # noqa: F811
    write(lab.root / "profiles", "ro-mirror", """\
        extends: cpu-ar
        service: {mirror: true}
        """)
    lab.deploy("ro-mirror", "lab-1")
    started = lab.json("shadow", "start", lab.profile("ro-ddtree"), "--host", "lab-2", "--production-host",
                       "lab-1", "--mirror", "--sample", "0.25", "--yes", expect=0)
    assert "mirrors to it" in started["detail"]
    try:
        production = f"http://{lab.lab.host('lab-1').address}:30000"
        with httpx.Client(base_url=production, timeout=120, trust_env=False,
                          headers={"Authorization": f"Bearer {TEST_API_KEY}"}) as client:
            for i in range(16):
                body = {"model": "tiny-llama", "messages": [{"role": "user", "content": FIZZ.format(10 + i)}],
                        "max_tokens": 16, "temperature": 0}
                assert client.post("/v1/chat/completions", json=body).status_code == 200
            shadow = f"http://{lab.lab.host('lab-2').address}:30001"
            deadline = time.monotonic() + 120     # the shadow compares after production answered
            while client.get(shadow + "/mirror/stats").json()["compared"] < 16 and time.monotonic() < deadline:
                time.sleep(0.5)
        doc = lab.json("shadow", "compare", "--mirrored", expect=0)   # default requirement: 16, equality 1.0
        comparison = doc["comparison"]
        assert comparison["mirrored"]["requests"] >= 16 and comparison["token_equality"] == 1.0
        assert comparison["shadow"]["accept_length"] > 1.0            # the distilled draft speculates
        assert comparison["mirrored"]["dropped"] == comparison["mirrored"]["failed"] == 0
        assert all("prompt" in s for s in comparison["samples"])
    finally:
        lab.json("shadow", "abort", "--yes", expect=0)
