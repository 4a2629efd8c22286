"""CI channels and consent: the contract scripts rely on."""

import io
import json

import pytest

from ddops import exits
from ddops.exits import BadInput
from ddops.rollout.output import Output, consent


def test_json_channel_writes_exactly_one_document():
    stream = io.StringIO()
    out = Output(json_doc=True, stream=stream)
    out.event("stage", "connecting", host="h1")
    assert out.finish(exits.FAILED, {"hosts": {"h1": "failed"}}) == 1
    doc = json.loads(stream.getvalue())
    assert doc == {"schema_version": 1, "ok": False, "exit_code": 1, "meaning": "gate failed and reverted",
                   "error": None, "hint": None, "hosts": {"h1": "failed"}}


def test_events_channel_writes_json_lines_ending_in_result():
    stream = io.StringIO()
    out = Output(json_events=True, stream=stream)
    out.event("host", "deploying", host="h1", status="running")
    out.finish(0, {})
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert [line["event"] for line in lines] == ["host", "result"]
    assert lines[0]["host"] == "h1" and lines[1]["exit_code"] == 0


def test_both_channels_is_bad_input():
    with pytest.raises(BadInput, match="choose one"):
        Output(json_doc=True, json_events=True)


def test_no_tty_without_yes_refuses():
    with pytest.raises(BadInput, match="pass --yes"):
        consent(False, "go?", Output(stream=io.StringIO()), is_tty=lambda: False)
    assert consent(True, "go?", Output(stream=io.StringIO()), is_tty=lambda: False)


def test_json_channel_never_prompts():
    with pytest.raises(BadInput):
        consent(False, "go?", Output(json_doc=True, stream=io.StringIO()), is_tty=lambda: True)


def test_fail_carries_the_message():
    stream = io.StringIO()
    assert Output(json_doc=True, stream=stream).fail(exits.BAD_INPUT, "p.yaml: hosts: unknown host") == 2
    assert json.loads(stream.getvalue())["error"] == "p.yaml: hosts: unknown host"
