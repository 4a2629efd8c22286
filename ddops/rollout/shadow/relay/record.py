"""The mirror record both log dialects build (docs/mirror.md "The record"): one shape, one stop
rule, one size bound, whichever runtime's logs it came from."""

from __future__ import annotations

MAX_RECORD_IDS = 16384     # as the bundled tap: longer records are not mirrored


def mirror_record(prompt: list[int], limit: int, s: dict, eos_ids: tuple[int, ...], answer: list[int],
                  reason: str | None, stop_ids_key: str) -> dict:
    """A record from a request's logged sampling `s` (temperature, top_p, top_k, stop,
    ignore_eos, and its own stop ids under `stop_ids_key`). The seed is left out: a seed fixes
    the draws of one runtime's sampler only, and the shadow's sampler is another's, so a seeded
    answer is compared by distribution. top_k 0 or -1 is off (-1)."""
    top_k = s.get("top_k", -1)
    stop = s.get("stop") or []
    stop_ids = set(s.get(stop_ids_key) or ()) | (set() if s.get("ignore_eos") else set(eos_ids))
    return {"prompt_ids": prompt, "max_new_tokens": limit,
            "sampling": {"temperature": float(s.get("temperature", 1.0)), "top_p": float(s.get("top_p", 1.0)),
                         "top_k": -1 if top_k in (0, -1) else int(top_k), "seed": None},
            "stop_strings": [str(x) for x in ([stop] if isinstance(stop, str) else stop)],
            "stop_ids": sorted(int(i) for i in stop_ids), "answer_ids": answer, "finish_reason": reason}


def too_long(record: dict) -> bool:
    """Over the tap's bound (a text answer's characters bound its tokens from above)."""
    return len(record["prompt_ids"]) + len(record.get("answer_ids", record.get("answer_text", ""))) > MAX_RECORD_IDS
