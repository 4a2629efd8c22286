"""SGLang 0.5.15's request log events -> mirror records. Pure: lines in, records and counts out.

With `--log-requests --log-requests-level 3 --log-requests-format json`,
sglang/srt/utils/request_logger.py writes one line per event to stdout (the journal):
  [2026-12-05 22:42:23] {"timestamp": ..., "event": "request.finished", "rid": RID,
                         "obj": {GenerateReqInput: input_ids, sampling_params, stream, ...},
                         "out": {"text": ..., "output_ids": [...], "meta_info": {"finish_reason": ...}}}
A finished event holds the whole request: the prompt's ids as the engine got them (an OpenAI
chat's after its template; null for a prompt sent as text, which SGLang tokenizes later), the
sampling parameters, and every id the request generated, a streamed one's included, the EOS
or stop id that ended it included (captured: tests/rollout/data/sglang_request_log.jsonl). So
unlike vLLM's lines no pairing is needed: one line, one record. The text around the JSON is
SGLang's log prefix; the JSON is parsed as JSON, so no prompt can pose as a field. Level 3
logs every list whole (level 2 cuts a list over 2048 to its ends with "...").
"""

from __future__ import annotations

import json
import re

from .record import mirror_record, too_long

_PREFIX = re.compile(r"^\[[^\]]{1,80}\] (?=\{\"timestamp\": )")
FINISHED = '"event": "request.finished"'
HEALTH_RID = "HEALTH_CHECK_"   # /health_generate's own requests (the gate's, the bake's): not traffic

# Sampling the record cannot carry: a request with one of these off its default is not
# comparable token for token (penalties, constraints, n > 1, adapters, custom processors).
DEFAULTS = {"n": 1, "presence_penalty": 0.0, "frequency_penalty": 0.0, "repetition_penalty": 1.0,
            "min_p": 0.0, "min_new_tokens": 0, "regex": None, "ebnf": None, "json_schema": None,
            "structural_tag": None, "stop_regex": None, "logit_bias": None, "custom_params": None}
OBJ_DEFAULTS = {"input_embeds": None, "image_data": None, "video_data": None, "audio_data": None,
                "lora_path": None, "custom_logit_processor": None}
FINISH_REASONS = ("stop", "length")


def event_of(line: str) -> dict | None:
    """The JSON event of a request-logger line, None for any other line; ValueError when its
    JSON does not parse (a line cut short)."""
    found = _PREFIX.match(line)
    return json.loads(line[found.end():]) if found else None


def _ids(value) -> list[int] | None:
    if isinstance(value, list) and all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in value):
        return value
    return None


class Finished:
    """Reads each `request.finished` event into a record; `feed` returns it (or None) and counts
    the rest. Nothing is kept between lines."""

    def __init__(self, eos_ids: tuple[int, ...]):
        self.eos_ids = eos_ids
        self.counts = dict.fromkeys(("offered", "truncated", "garbled", "streamed", "skipped_unsupported",
                                     "skipped_long", "skipped_text_prompt", "aborted", "health_checks"), 0)

    def feed(self, line: str, cut: bool = False) -> dict | None:
        """One log line; `cut`: the source knows it is incomplete (journald split it)."""
        if FINISHED not in line[:200]:
            return None
        if cut:
            self.counts["truncated"] += 1
            return None
        try:
            event = event_of(line)
        except (ValueError, RecursionError):
            self.counts["truncated"] += 1      # a finished event whose JSON does not close
            return None
        if event is None or event.get("event") != "request.finished":
            return None
        try:
            return self._finished(event)
        except (AttributeError, TypeError, ValueError, KeyError):
            self.counts["garbled"] += 1
            return None

    def _finished(self, event: dict) -> dict | None:
        if str(event.get("rid", "")).startswith(HEALTH_RID):
            self.counts["health_checks"] += 1
            return None
        obj, out = event["obj"], event["out"]
        if not isinstance(obj, dict) or not isinstance(out, dict):    # a batch: a list of requests
            self.counts["garbled"] += 1
            return None
        self.counts["offered"] += 1
        reason = (out.get("meta_info") or {}).get("finish_reason") or {}
        if reason.get("type") not in FINISH_REASONS:
            self.counts["aborted"] += 1                # aborted, or not finished by its own rule
            return None
        if obj.get("input_ids") is None:
            self.counts["skipped_text_prompt"] += 1    # tokenized after the log: no ids to send
            return None
        record = self.record(obj, out, reason["type"])
        if record is None:
            self.counts["skipped_unsupported"] += 1
            return None
        if too_long(record):
            self.counts["skipped_long"] += 1
            return None
        if obj.get("stream"):
            self.counts["streamed"] += 1
        return record

    def record(self, obj: dict, out: dict, reason: str) -> dict | None:
        """The mirror record (docs/mirror.md), None when a part is missing or not expressible."""
        s = obj.get("sampling_params") or {}
        prompt, answer, limit = _ids(obj.get("input_ids")), _ids(out.get("output_ids")), s.get("max_new_tokens")
        if limit is None and reason == "stop" and answer:
            # No max_tokens: SGLang's limit was the context's room, and production stopped by its
            # own rule at this length; the shadow given exactly this many stops there too iff it
            # generates the same ids (a different answer is cut there, and counts as different).
            limit = len(answer)
        if not prompt or answer is None or not isinstance(limit, int) or isinstance(limit, bool):
            return None
        if any(s.get(key, default) != default for key, default in DEFAULTS.items()):
            return None
        if any(obj.get(key, default) != default for key, default in OBJ_DEFAULTS.items()):
            return None
        return mirror_record(prompt, limit, s, self.eos_ids, answer, reason, "stop_token_ids")
