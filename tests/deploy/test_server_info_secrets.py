"""The one /server_info reader drops the secrets SGLang returns among its server arguments
(field names of SGLang 0.5.15's real answer; the live answer is checked in test_lab_sglang.py)."""

import httpx

from ddops import server_info


def test_secret_fields_are_dropped_and_the_rest_kept():
    answer = {"model_path": "/m", "api_key": "k", "admin_api_key": "a", "ssl_keyfile": "/k.pem",
              "ssl_keyfile_password": "p", "max_total_num_tokens": 16384, "tokenizer_path": "/m",
              "speculative_num_draft_tokens": None,
              "internal_states": [{"api_key": "k", "avg_spec_accept_length": 1.5}]}
    transport = httpx.MockTransport(lambda request: httpx.Response(200, json=answer))
    with httpx.Client(base_url="http://x", transport=transport) as client:
        kept = server_info.read(client)
    assert set(answer) - set(kept) == {"api_key", "admin_api_key", "ssl_keyfile_password"}
    assert kept["max_total_num_tokens"] == 16384 and kept["ssl_keyfile"] == "/k.pem"
    assert kept["internal_states"] == [{"avg_spec_accept_length": 1.5}]      # the copy inside too
