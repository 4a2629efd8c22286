"""vLLM 0.32's request log lines -> mirror records. Pure: text in, records and counts out.

With `--enable-log-requests --enable-log-outputs --log-level=DEBUG`,
vllm/entrypoints/serve/utils/request_logger.py writes per request, in this order:
  DEBUG  Request RID details: prompt: '...', prompt_token_ids: [...], prompt_embeds shape: None.
  INFO   Received request RID: params: SamplingParams(...), lora_request: None.
  DEBUG  Generated response RID details: output_token_ids: [...]
  INFO   Generated response RID: output: '...', finish_reason: stop
Texts are written with %r, so a prompt cannot start a line of its own; each pattern is
anchored at the line's end, where the logger's own words follow the quoted text. A streamed
chat ends with
  DEBUG  Generated response RID (streaming complete) details: output_token_ids: None
  INFO   Generated response RID (streaming complete): output: '...', finish_reason: streaming_complete
whose text is the concatenation of every delta's text (chat_completion/serving.py,
previous_texts): its record carries `answer_text` instead of `answer_ids`, and no finish
reason. /v1/completions logs no output at all: counted, never guessed.
"""

from __future__ import annotations

import ast
import re
import time
from collections import OrderedDict

from .record import mirror_record, too_long

MAX_PENDING = 1024         # requests whose lines are still arriving
PENDING_S = 600.0          # a request with no answer logged by then is forgotten (counted)

_HEAD = re.compile(r"^(?:\(\w+ pid=\d+\) )?(DEBUG|INFO) [\d-]+ [\d:]+ \[[^\]]*request_logger\.py:\d+\] (.*)$")
_RID = r"([A-Za-z0-9_.:-]{1,200})"
_IDS = r"(\[[0-9, ]*\]|None)"
PROMPT = re.compile(rf"^Request {_RID} details: prompt: .*, prompt_token_ids: {_IDS}, prompt_embeds shape: None\.$")
PARAMS = re.compile(rf"^Received request {_RID}: params: SamplingParams\((.*)\), lora_request: None\.$")
ANSWER = re.compile(rf"^Generated response {_RID} details: output_token_ids: {_IDS}$")
FINISH = re.compile(rf"^Generated response {_RID}: output: .*, finish_reason: (\w+)$")
STREAMED = re.compile(rf"^Generated response {_RID} \(streaming complete\): output: (.*), "
                      r"finish_reason: streaming_complete$")
# a delta (when deltas are logged), or the ids line of a stream's end: nothing to keep
STREAM = re.compile(rf"^Generated response {_RID} \((streaming delta)\)|"
                    rf"^Generated response {_RID} \((streaming complete)\) details: output_token_ids: None$")
# The start of a line this parser reads: a line that starts so and matches none of the above
# was cut (journald's LineMax, --max-log-len mid-list) or is not vLLM's.
OURS = re.compile(r"^(Request \S+ details:|Received request |Generated response )")
CUT_RID = re.compile(r"^(?:Request|Received request|Generated response) ([^\s:]+)")

# SamplingParams fields the record cannot carry: a request using one is not comparable.
DEFAULTS = {"n": 1, "presence_penalty": 0.0, "frequency_penalty": 0.0, "repetition_penalty": 1.0,
            "min_p": 0.0, "min_tokens": 0, "bad_words": [], "structured_outputs": None,
            "logit_bias": None, "allowed_token_ids": None, "logprobs": None, "prompt_logprobs": None}
# A text record compares the shadow's text as the bundled server shows it to a client: the
# stop string left out, special tokens skipped.
TEXT_DEFAULTS = {"include_stop_str_in_output": False, "skip_special_tokens": True,
                 "spaces_between_special_tokens": True}
WANTED = ("temperature", "top_p", "top_k", "seed", "stop", "stop_token_ids", "ignore_eos", "max_tokens",
          *DEFAULTS, *TEXT_DEFAULTS)


def message(line: str) -> tuple[str, str] | None:
    """(level, message) of a request-logger line, None for any other line."""
    head = _HEAD.match(line.rstrip("\n"))
    return (head.group(1), head.group(2)) if head else None


def ids_of(text: str) -> list[int] | None:
    if text == "None":
        return None
    inner = text[1:-1].strip()
    return [int(i) for i in inner.split(",")] if inner else []


def split_fields(body: str) -> dict[str, str]:
    """`k=v, k=v` at the top level of a repr (commas inside quotes and brackets kept)."""
    fields, depth, quote, start, i = {}, 0, None, 0, 0
    while i <= len(body):
        c = body[i] if i < len(body) else ","
        if quote:
            if c == "\\":
                i += 1
            elif c == quote:
                quote = None
        elif c in "'\"":
            quote = c
        elif c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        elif c == "," and depth == 0:
            key, _, value = body[start:i].strip().partition("=")
            fields[key] = value
            start = i + 1
        i += 1
    if quote or depth:
        raise ValueError("unbalanced SamplingParams")
    return fields


def sampling_of(body: str) -> dict:
    """The SamplingParams values the record needs, parsed as Python literals."""
    fields = split_fields(body)
    return {key: ast.literal_eval(fields[key]) for key in WANTED if key in fields}


class Pairing:
    """Joins each request's lines; `feed` returns a finished record (or None) and counts the
    rest. Bounded: at most MAX_PENDING requests wait, each for at most PENDING_S."""

    def __init__(self, eos_ids: tuple[int, ...], clock=time.monotonic):
        self.eos_ids = eos_ids
        self.clock = clock
        self.pending: OrderedDict[str, dict] = OrderedDict()
        self.counts = dict.fromkeys(("offered", "truncated", "garbled", "streamed",
                                     "skipped_unsupported", "skipped_long", "unanswered"), 0)

    def feed(self, line: str, cut: bool = False) -> dict | None:
        """One log line; `cut`: the source knows it is incomplete (journald split it)."""
        self._expire()
        found = message(line)
        if found is None:
            return None
        text = found[1]
        if cut:
            if OURS.match(text):
                self.cut(text)
            return None
        for pattern, step in ((PROMPT, self._prompt), (PARAMS, self._params), (ANSWER, self._answer),
                              (FINISH, self._finish), (STREAMED, self._streamed),
                                (STREAM, self._stream)):
            match = pattern.match(text)
            if match:
                try:
                    return step(*match.groups())
                except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
                    self._drop(match.group(1), "garbled")
                    return None
        if OURS.match(text):
            self.cut(text)
        return None

    def cut(self, text: str) -> None:
        """A line of ours that does not end as vLLM ends it: its request is not mirrored."""
        named = CUT_RID.match(text)
        self.counts["truncated"] += 1
        if named:
            self.pending.pop(named.group(1), None)

    def _prompt(self, rid: str, ids: str) -> None:
        if rid in self.pending:          # a reused request id (X-Request-Id): neither is mirrored
            self._drop(rid, "garbled")
            return
        if len(self.pending) >= MAX_PENDING:
            self.pending.popitem(last=False)
            self.counts["unanswered"] += 1
        self.pending[rid] = {"at": self.clock(), "prompt": ids_of(ids)}

    def _params(self, rid: str, body: str) -> None:
        if rid in self.pending:
            self.pending[rid]["sampling"] = sampling_of(body)

    def _answer(self, rid: str, ids: str) -> None:
        if rid in self.pending:
            self.pending[rid]["answer"] = ids_of(ids)

    def _stream(self, *groups: str | None) -> None:
        """A delta, or the ids line of a stream's end (ids None): nothing to keep."""

    def _streamed(self, rid: str, quoted: str) -> dict | None:
        """A stream's end: its whole text, as vLLM's %r wrote it (a literal, never evaluated)."""
        if rid not in self.pending:
            return None
        text = ast.literal_eval(quoted)
        if not isinstance(text, str):
            raise ValueError("streamed output is not a string")
        self.counts["streamed"] += 1
        return self._finish(rid, None, text)

    def _finish(self, rid: str, reason: str | None, text: str | None = None) -> dict | None:
        entry = self.pending.pop(rid, None)
        if entry is None:
            return None
        self.counts["offered"] += 1
        record = self.record(entry, reason) if text is None else self.text_record(entry, text)
        if record is None:
            self.counts["skipped_unsupported"] += 1
        elif too_long(record):
            self.counts["skipped_long"] += 1     # a text's characters bound its tokens from above
            return None
        return record

    def text_record(self, entry: dict, text: str) -> dict | None:
        """A streamed chat's record: the answer's text, no ids, no finish reason."""
        s = entry.get("sampling") or {}
        if any(key in s and s[key] != default for key, default in TEXT_DEFAULTS.items()):
            return None
        record = self.record({**entry, "answer": []}, None)
        if record is None:
            return None
        del record["answer_ids"], record["finish_reason"]
        return {**record, "answer_text": text}

    def record(self, entry: dict, reason: str) -> dict | None:
        """The mirror record (docs/mirror.md), None when a part is missing or not expressible."""
        s, prompt, answer = entry.get("sampling"), entry.get("prompt"), entry.get("answer")
        if not s or not prompt or answer is None or not isinstance(s.get("max_tokens"), int):
            return None
        if any(key in s and s[key] != default for key, default in DEFAULTS.items()):
            return None
        return mirror_record(prompt, s["max_tokens"], s, self.eos_ids, answer, reason, "stop_token_ids")

    def _drop(self, rid: str, why: str) -> None:
        self.pending.pop(rid, None)
        self.counts[why] += 1

    def _expire(self) -> None:
        now = self.clock()
        while self.pending and now - next(iter(self.pending.values()))["at"] > PENDING_S:
            self.pending.popitem(last=False)
            self.counts["unanswered"] += 1
