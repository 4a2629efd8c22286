"""`ddops demo`'s last step (the README's main command): a request from outside the host and
the line that says what served it, against a real bundled runtime serving plain decoding and
DDTree. Plain decoding has no speculative lane to report a setting (its server arguments still
say `speculative_adaptive: "on"`), which once crashed the demo after a passing deploy."""

from __future__ import annotations

import pytest

from ddops.commands import demo
from ddops.deploy import show
from tests.deploy.models import tiny_pair
from tests.server_process import ServerProcess

KEY = "demo-test-key"


@pytest.mark.parametrize("flags, method", [
    ((), "method plain,"),
    (("--speculative-algorithm", "DDTREE", "--speculative-ddtree-budget", "4"), "method DDTREE (adaptive, running"),
])
def test_the_demo_request_says_what_served_it(cache_dir, tmp_path, capsys, flags, method):
    target, draft = tiny_pair(cache_dir)
    draft_flags = ("--speculative-draft-model-path", str(draft)) if flags else ()
    server = ServerProcess(target, tmp_path / "server.log", "--served-model-name", "tiny", "--context-length", "256",
                           *flags, *draft_flags, api_key=KEY)
    try:
        server.wait_ready()
        with show.console.capture() as captured:
            demo.ask(server.url, "tiny", KEY)
    finally:
        server.stop()
    text = captured.get()
    assert "answer: '" in text and method in text, text
    assert "draft's average accepted length" in text and "tokens/s" in text
