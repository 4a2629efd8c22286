"""SGLang 0.5.15's request log events -> mirror records, fast: the journal of a real SGLang on a
lab host (`--log-requests --log-requests-level 3 --log-requests-format json`, captured
2026-12-05 into tests/rollout/data/sglang_request_log.jsonl, the clients' answers beside it)
read as the relay reads it. SGLang gives no token ids to its clients, so each record's ids are
checked against the client's text through SmolLM2's own tokenizer. The real path (SGLang
serving, the relay following its journal, the bundled shadow comparing) is
tests/deploy/test_lab_sglang.py's mirror test."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from ddops.rollout.shadow.relay.__main__ import READERS
from ddops.rollout.shadow.relay.sglang_log import Finished
from ddops.rollout.shadow.relay.source import journal_lines
from tests.vllm_server import SMOLLM2

DATA = Path(__file__).parent / "data"
ENTRIES = (DATA / "sglang_request_log.jsonl").read_text().splitlines()
SEEN = json.loads((DATA / "sglang_request_log.answers.json").read_text())
EOS = 2


def read(entries=ENTRIES) -> tuple[list[dict], Finished]:
    reader = Finished((EOS,))
    return [r for r in (reader.feed(line, cut) for line, cut in journal_lines(entries)) if r], reader


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    path = SMOLLM2 / "tokenizer.json"
    if not path.is_file():
        pytest.skip(f"{path}: run make models")
    return Tokenizer.from_file(str(path))


def text_of(tokenizer, ids: list[int]) -> str:
    return tokenizer.decode(ids, skip_special_tokens=True)


def by_answer(records: list[dict], tokenizer, text: str) -> list[dict]:
    return [r for r in records if text_of(tokenizer, r["answer_ids"]) == text]


def test_the_relay_reads_sglang_logs_by_the_runtime_tables_dialect():
    assert READERS["sglang"] is Finished


def test_captured_events_give_the_records_the_clients_received(tokenizer):
    records, reader = read()
    chat = [r for r in by_answer(records, tokenizer, SEEN["chat"]["text"]) if r["stop_ids"] == [EOS]]
    assert len(chat) == 2 and all(r["answer_ids"][-1] == EOS and r["finish_reason"] == "stop" for r in chat)   # EOS kept
    first = chat[0]
    assert tokenizer.decode(first["prompt_ids"], skip_special_tokens=False).endswith(
        "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n")   # the template applied
    assert first["sampling"] == {"temperature": 0.0, "top_p": 1.0, "top_k": -1, "seed": None}
    assert (first["stop_ids"], first["stop_strings"]) == ([EOS], [])
    assert len(first["answer_ids"]) == SEEN["chat"]["usage"]["completion_tokens"]
    # a streamed chat's event carries every id it streamed: the same record as a whole answer
    streamed = by_answer(records, tokenizer, SEEN["stream"]["text"])
    assert len(streamed) == 1 and streamed[0]["finish_reason"] == "length" and len(streamed[0]["answer_ids"]) == 32
    assert by_answer(records, tokenizer, SEEN["stream_eos"]["text"])[0]["answer_ids"][-1] == EOS
    assert reader.counts["streamed"] == 3                     # that one, and "Say hi." streamed twice
    # a stop string: the ids run through the token that completed it, the client's text stops before it
    stopped = [r for r in records if r["stop_strings"] == ["Paris"]]
    assert stopped and text_of(tokenizer, stopped[0]["answer_ids"]) == SEEN["stop_matched"]["text"] + "Paris"
    # a request's own stop ids join the EOS ids
    assert [r["stop_ids"] for r in records if 30 in r["stop_ids"]][0] == [EOS, 30]
    # a completion whose prompt came as ids is mirrored; one whose prompt came as text is not
    # (SGLang tokenizes it after logging, so the log holds no ids)
    assert [r["prompt_ids"] for r in records if r["prompt_ids"] == [504, 3575, 282, 4649, 314]]
    assert reader.counts["skipped_text_prompt"] == 2         # the gate's smoke /generate and one completion
    # seeded sampling: SGLang's seed fixes its own draws only, so the record leaves it out
    seeded = [r for r in records if r["sampling"]["temperature"] == 0.7][0]
    assert seeded["sampling"] == {"temperature": 0.7, "top_p": 0.9, "top_k": -1, "seed": None}
    # no max_tokens: the limit is the answer's length, where production stopped by its own rule
    free = by_answer(records, tokenizer, SEEN["no_max_tokens"]["text"])[0]
    assert free["max_new_tokens"] == len(free["answer_ids"]) and free["answer_ids"][-1] == EOS


def test_requests_the_record_cannot_carry_are_counted_not_sent():
    records, reader = read()
    # a presence penalty (1), and n=2 twice over: each a parent event and two children (6)
    assert reader.counts["skipped_unsupported"] == 7
    assert reader.counts["health_checks"] == 2           # /health_generate's own requests
    assert not [r for r in records if r["max_new_tokens"] == 1]
    counted = sum(reader.counts[k] for k in ("skipped_unsupported", "skipped_text_prompt", "aborted", "skipped_long"))
    assert reader.counts["offered"] == len(records) + counted
    assert (reader.counts["garbled"], reader.counts["truncated"], reader.counts["aborted"]) == (0, 0, 0)


def finished_line() -> str:
    """A chat's finished event (its prompt's ids logged)."""
    return next(m for m in (json.loads(e)["MESSAGE"] for e in ENTRIES)
                if '"event": "request.finished"' in m and '"input_ids": [1, 9690' in m)


def test_cut_unclosed_and_forged_lines_send_nothing():
    line = finished_line()
    reader = Finished((EOS,))
    assert reader.feed(line) is not None
    assert reader.feed(line, cut=True) is None                 # journald split it at LineMax
    assert reader.feed(line[: len(line) // 2]) is None         # its JSON does not close
    assert reader.counts["truncated"] == 2
    # a prompt that quotes an event is a JSON string inside the received event: never an event
    forged = line.replace('"event": "request.finished"', '"event": "request.received"', 1)
    forged = forged.replace('"text": "', '"text": "[2026-12-05 22:42:21] {\\"timestamp\\": 1, \\"event\\": '
                            '\\"request.finished\\", ', 1)
    assert reader.feed(forged) is None
    batch = json.loads(line[line.index("{"):])
    batch["obj"] = [batch["obj"], batch["obj"]]
    assert reader.feed(line[: line.index("{")] + json.dumps(batch)) is None
    aborted = json.loads(line[line.index("{"):])
    aborted["out"]["meta_info"]["finish_reason"] = {"type": "abort", "message": "client gone"}
    assert reader.feed(line[: line.index("{")] + json.dumps(aborted)) is None
    assert (reader.counts["garbled"], reader.counts["aborted"], reader.counts["offered"]) == (1, 1, 2)
