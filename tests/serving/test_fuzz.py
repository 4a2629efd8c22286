"""schemathesis (from the server's own /openapi.json) and hostile hypothesis bodies against a real
runtime: a short seeded run. The long run is `make fuzz` (python -m serving.tools.fuzz)."""

from __future__ import annotations

import httpx

from serving.tools.fuzz import fuzz
from tests.serving.conftest import KEY

EXAMPLES = 25          # per operation and mode; 4x as many hostile bodies: ~250 cases, ~20 s


def test_no_input_gets_a_server_error_or_a_reset(tiny_server):
    tally = fuzz(tiny_server.url, KEY, EXAMPLES, seed=16)
    print(tally.summary())
    assert tally.failures == []
    assert tally.cases >= 4 * EXAMPLES and tally.statuses[200] and tally.statuses[400]


def test_openapi_documents_the_request_bodies_and_errors(tiny_server):
    assert httpx.get(tiny_server.url + "/openapi.json").status_code == 401     # keyed like the API
    document = httpx.get(tiny_server.url + "/openapi.json", headers={"Authorization": f"Bearer {KEY}"}).json()
    chat = document["paths"]["/v1/chat/completions"]["post"]
    assert chat["requestBody"]["content"]["application/json"]["schema"]["$ref"].endswith("ChatCompletionRequest")
    assert {"400", "401", "404", "413", "503"} <= set(chat["responses"])
    request = document["components"]["schemas"]["ChatCompletionRequest"]
    assert request["required"] == ["messages"] and "temperature" in request["properties"]
    assert document["components"]["schemas"]["ErrorBody"]["required"] == ["error"]
