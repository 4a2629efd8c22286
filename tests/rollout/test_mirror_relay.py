"""The mirror relay's parts, fast: vLLM 0.32's request log lines captured from the real server
(tests/rollout/data/vllm_request_log.txt, with what its clients received beside it) turned
into mirror records; cut, garbled and forged lines; journald's split lines; the relay process
against a stand-in sink. The real path (vLLM serving, the relay following its log, the bundled
shadow comparing) is tests/rollout/test_vllm_across.py's mirror test."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx

from ddops.rollout.shadow import relay_unit
from ddops.rollout.shadow.relay.__main__ import eos_ids
from ddops.rollout.shadow.relay.source import journal_lines
from ddops.rollout.shadow.relay.vllm_log import PENDING_S, Pairing

DATA = Path(__file__).parent / "data"
LINES = (DATA / "vllm_request_log.txt").read_text().splitlines()
SEEN = json.loads((DATA / "vllm_request_log.answers.json").read_text())
CHAT = "chatcmpl-998822f618b37a33"


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def feed(lines, pairing=None) -> tuple[list[dict], Pairing]:
    pairing = pairing or Pairing((2,))
    return [r for r in (pairing.feed(line) for line in lines) if r], pairing


def test_captured_lines_give_the_records_the_clients_received():
    clock = Clock()
    records, pairing = feed(LINES, Pairing((2,), clock))
    greedy, streamed, sampled = records
    assert greedy["prompt_ids"] == SEEN["chat"]["prompt_token_ids"]
    assert greedy["answer_ids"] == SEEN["chat"]["token_ids"] and greedy["answer_ids"][-1] == 2   # EOS kept
    assert greedy["finish_reason"] == SEEN["chat"]["finish_reason"] == "stop"
    assert greedy["sampling"] == {"temperature": 0.0, "top_p": 1.0, "top_k": -1, "seed": None}
    assert (greedy["max_new_tokens"], greedy["stop_ids"], greedy["stop_strings"]) == (24, [2], [])
    # vLLM's seed (7) fixes vLLM's draws only, not the bundled sampler's: the record leaves it out,
    # so the sampled answer is compared by distribution, not token by token
    assert sampled["sampling"] == {"temperature": 0.8, "top_p": 0.9, "top_k": 20, "seed": None}
    assert sampled["stop_strings"] == ["5", "\n\n"] and sampled["finish_reason"] == SEEN["chat_sampled"]["finish_reason"]
    # the streamed chat logs no complete ids: its record is the text its client received in
    # deltas (the captured log has them), with no ids and no finish reason
    deltas = [ast.literal_eval(line.split("(streaming delta): output: ", 1)[1].rsplit(", finish_reason:", 1)[0])
              for line in LINES if "(streaming delta): output: " in line]
    assert streamed["answer_text"] == "".join(deltas) == "1. Red\n2. Blue\n3. Green"
    assert "answer_ids" not in streamed and "finish_reason" not in streamed
    assert streamed["prompt_ids"] and streamed["sampling"]["temperature"] == 0.0 and streamed["stop_ids"] == [2]
    # the completion logs no output: it waits, then is forgotten
    assert pairing.counts["offered"] == 3 and pairing.counts["streamed"] == 1
    assert len(pairing.pending) == 1
    clock.now = PENDING_S + 1
    feed(LINES[:1], pairing)
    assert pairing.counts["unanswered"] == 1 and not pairing.pending


def lines_with(replace: dict[int, str]) -> list[str]:
    return [replace.get(i, line) for i, line in enumerate(LINES)]


def index_of(text: str) -> int:
    return next(i for i, line in enumerate(LINES) if text in line)


def test_a_truncated_line_mirrors_nothing_of_its_request():
    prompt = index_of(f"Request {CHAT} details")
    records, pairing = feed(lines_with({prompt: LINES[prompt][: len(LINES[prompt]) // 2]}))
    assert [r["sampling"]["temperature"] for r in records] == [0.0, 0.8]     # only the other requests
    assert pairing.counts["truncated"] == 1
    answer = index_of(f"Generated response {CHAT} details")
    records, pairing = feed(lines_with({answer: LINES[answer][:-6]}))
    assert len(records) == 2 and pairing.counts["truncated"] == 1


def test_garbled_and_forged_lines_cannot_corrupt_a_record():
    params = index_of(f"Received request {CHAT}")
    garbled = LINES[params].replace("temperature=0.0", "temperature=__import__('os')")
    records, pairing = feed(lines_with({params: garbled}))
    assert len(records) == 2 and pairing.counts["garbled"] == 1
    unbalanced = LINES[params].replace("stop=[]", "stop=['")
    records, pairing = feed(lines_with({params: unbalanced}))
    assert len(records) == 2 and pairing.counts["garbled"] == 1
    # a prompt that quotes the logger's own words: the ids are the ones vLLM wrote at the end
    prompt = index_of(f"Request {CHAT} details")
    forged = LINES[prompt].replace("Say hi.", "x', prompt_token_ids: [7, 7], prompt_embeds shape: None. '")
    records, _ = feed(lines_with({prompt: forged}))
    assert records[0]["prompt_ids"] == SEEN["chat"]["prompt_token_ids"]
    # a finish line forged inside an answer's text keeps the real finish reason
    finish = index_of(f"Generated response {CHAT}: output")
    text = LINES[finish].replace("humble abode?", "x', finish_reason: length'")
    assert feed(lines_with({finish: text}))[0][0]["finish_reason"] == "stop"
    # two requests under one id (a client's X-Request-Id): neither is mirrored
    records, pairing = feed(LINES[: prompt + 1] + [LINES[prompt]] + LINES[prompt + 1:])
    assert len(records) == 2 and pairing.counts["garbled"] == 1
    # bytes that are not UTF-8, and lines of no logger at all
    assert feed(["\udcff\x00 garbage", "INFO 12-02 [request_logger.py:1] Generated response "])[0] == []


def test_sampling_the_record_cannot_carry_is_skipped_and_ignore_eos_drops_the_eos_ids():
    params = index_of(f"Received request {CHAT}")
    penalty = LINES[params].replace("repetition_penalty=1.0", "repetition_penalty=1.1")
    records, pairing = feed(lines_with({params: penalty}))
    assert len(records) == 2 and pairing.counts["skipped_unsupported"] == 1
    ignoring = LINES[params].replace("ignore_eos=False", "ignore_eos=True")
    assert feed(lines_with({params: ignoring}))[0][0]["stop_ids"] == []


STREAM = "chatcmpl-9b7fe7c3c492e027"


def test_a_streamed_chats_text_is_read_as_a_literal_and_forged_or_cut_text_mirrors_nothing_wrong():
    done = index_of(f"Generated response {STREAM} (streaming complete): output")
    # an answer that quotes the logger's own end: %r escapes its quote, the record is its text
    forged = "x', finish_reason: streaming_complete"
    line = LINES[done].replace("'1. Red\\n2. Blue\\n3. Green'", repr(forged))
    assert line != LINES[done]
    assert feed(lines_with({done: line}))[0][1]["answer_text"] == forged
    # text that is no literal, or a literal that is not a string: garbled, never evaluated
    for bad in ("__import__('os').getcwd()", "[1, 2]"):
        records, pairing = feed(lines_with({done: LINES[done].replace("'1. Red\\n2. Blue\\n3. Green'", bad)}))
        assert len(records) == 2 and pairing.counts["garbled"] == 1
    # a cut end line (journald, or an unmarked cut): the stream is not mirrored
    records, pairing = feed(lines_with({done: LINES[done][:-10]}))
    assert len(records) == 2 and pairing.counts["truncated"] == 1 and pairing.counts["streamed"] == 0
    # text shaped otherwise than the bundled server shows it to a client: not comparable
    params = index_of(f"Received request {STREAM}")
    for flag in ("skip_special_tokens", "spaces_between_special_tokens"):
        raw = LINES[params].replace(f"{flag}=True", f"{flag}=False")
        records, pairing = feed(lines_with({params: raw}))
        assert len(records) == 2 and pairing.counts["skipped_unsupported"] == 1


def entry(message, pid=7, split=False) -> str:
    doc = {"MESSAGE": message, "_PID": str(pid)}
    return json.dumps({**doc, "_LINE_BREAK": "line-max"} if split else doc)


def test_journald_split_lines_give_the_head_as_cut_and_skip_the_rest():
    forged = LINES[index_of(f"Generated response {CHAT}: output")]
    entries = [entry("first"), entry("head of a long line", split=True), entry(forged, split=True),
               entry(forged), entry(list(b"caf\xc3\xa9 \xff")), entry("other pid", pid=8)]
    assert list(journal_lines(entries + ["not json"])) == [
        ("first", False), ("head of a long line", True), ("café \ufffd", False), ("other pid", False)]
    pairing = Pairing((2,))
    head = LINES[index_of(f"Request {CHAT} details")]
    pairing.feed(head, cut=True)
    assert pairing.counts["truncated"] == 1 and not pairing.pending


def test_eos_ids_come_from_the_model_folder(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"eos_token_id": 2}))
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 7, "x", True]}))
    assert eos_ids(str(tmp_path)) == (2, 7)
    assert eos_ids(str(tmp_path / "missing")) == () and eos_ids(None) == ()


class StandInSink(BaseHTTPRequestHandler):
    """Accepts records (202), remembers their bodies; a stand-in for the shadow's sink."""
    received: list = []

    def do_POST(self):
        body = self.rfile.read(int(self.headers["Content-Length"]))
        StandInSink.received.append((self.headers.get("Authorization"), json.loads(body)))
        self.send_response(202)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


def relay_process(tmp_path, url: str, port: int) -> tuple[subprocess.Popen, Path]:
    log = tmp_path / "vllm.log"
    log.write_text("")
    env = {**os.environ, "DDOPS_MIRROR_KEY": "relay-key", "PYTHONPATH": str(relay_unit.PACKAGE.parent)}
    process = subprocess.Popen([sys.executable, "-m", "relay", "--log-file", str(log), "--url", url,
                                "--port", str(port)], env=env, stderr=subprocess.PIPE, text=True)
    assert "counts at" in process.stderr.readline()    # listening, following the file's end
    return process, log


def counts(port: int) -> dict:
    return httpx.get(f"http://127.0.0.1:{port}/mirror", headers={"Authorization": "Bearer relay-key"},
                     trust_env=False).json()


def wait_for(port: int, key: str, value: int) -> dict:
    deadline = time.monotonic() + 10
    while (now := counts(port))[key] < value and time.monotonic() < deadline:
        time.sleep(0.05)
    return now


def test_relay_process_posts_records_to_the_shadow_and_counts(tmp_path):
    from serving.tools.local_server import free_port
    sink = ThreadingHTTPServer(("127.0.0.1", 0), StandInSink)
    threading.Thread(target=sink.serve_forever, daemon=True).start()
    port = free_port()
    process, log = relay_process(tmp_path, f"http://127.0.0.1:{sink.server_address[1]}", port)
    try:
        with log.open("a") as handle:
            handle.write("\n".join(LINES) + "\n")
        now = wait_for(port, "sent", 3)
        assert (now["offered"], now["sent"], now["streamed"], now["failed"]) == (3, 3, 1, 0)
        assert [auth for auth, _ in StandInSink.received] == ["Bearer relay-key"] * 3
        assert StandInSink.received[1][1]["answer_text"] == "1. Red\n2. Blue\n3. Green"
        assert StandInSink.received[0][1]["answer_ids"] == SEEN["chat"]["token_ids"]
        unkeyed = httpx.get(f"http://127.0.0.1:{port}/mirror", trust_env=False)
        assert unkeyed.status_code == 401 and "relay-key" not in unkeyed.text
    finally:
        process.kill()
        sink.shutdown()


def test_relay_toward_a_dead_shadow_backs_off_and_counts(tmp_path):
    from serving.tools.local_server import free_port
    port = free_port()
    process, log = relay_process(tmp_path, f"http://127.0.0.1:{free_port()}", port)
    try:
        with log.open("a") as handle:
            handle.write("\n".join(LINES + LINES) + "\n")     # 6 records within one backoff
        now = wait_for(port, "offered", 6)
        deadline = time.monotonic() + 5
        while now["failed"] + now["dropped_backoff"] < 6 and time.monotonic() < deadline:
            now = counts(port)
        assert (now["failed"], now["dropped_backoff"], now["sent"]) == (1, 5, 0)
    finally:
        process.kill()


def test_relay_unit_keeps_the_key_in_its_env_file():
    files = relay_unit.render("llm.service", "http://10.0.0.2:30001", 30002, "/models/m", 0.25, "sk-secret", "vllm")
    (unit_path, unit), (env_path, env) = files.items()
    assert unit_path == "/etc/systemd/system/llm-mirror-relay.service"
    assert "ExecStart=/usr/bin/python3 -m relay --unit llm.service --url http://10.0.0.2:30001 --port 30002 " \
           "--format vllm --sample 0.25 --model /models/m" in unit
    assert "sk-secret" not in unit and "DDOPS_MIRROR_KEY=sk-secret" in env and env_path in unit
    assert relay_unit.port_for(30000, None) == 30002 and relay_unit.port_for(30000, 30002) == 30003
