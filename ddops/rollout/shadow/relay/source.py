"""Where the relay reads production's log lines: the unit's journal, or a file (a process run
by hand, the tests). Each yields (line, cut): `cut` marks a line known to be incomplete."""

from __future__ import annotations

import json
import subprocess
import time


def journal_command(unit: str) -> list[str]:
    # -n 0: from now on (old requests are not mirrored); json: journald marks a line it split
    # at LineMax (_LINE_BREAK=line-max), which `-o cat` would hide; --all: without it the json
    # output gives null for a field over 4096 bytes, i.e. any long prompt's line.
    return ["journalctl", "--unit", unit, "--follow", "--lines", "0", "--output", "json", "--all"]


def journal_lines(entries):
    """Journal entries (JSON lines) -> (message, cut). A message journald split into several
    entries gives its first piece with cut=True; the pieces after it are skipped (they start
    mid-text, where a prompt's own words could look like a log line)."""
    continuing: set = set()
    for raw in entries:
        try:
            entry = json.loads(raw)
            text = message_text(entry.get("MESSAGE"))
        except (ValueError, AttributeError):
            continue
        stream = entry.get("_PID"), entry.get("_STREAM_ID")
        split = entry.get("_LINE_BREAK") == "line-max"
        if stream in continuing:
            if not split:
                continuing.discard(stream)
            continue
        if split:
            continuing.add(stream)
        if text is not None:
            yield text, split


def message_text(value) -> str | None:
    """MESSAGE is a string, or an array of bytes when it is not valid UTF-8."""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(b, int) and 0 <= b < 256 for b in value):
        return bytes(value).decode("utf-8", "replace")
    return None


def follow_journal(unit: str):
    """Started at once (the relay reports ready only once it follows), read lazily."""
    process = subprocess.Popen(journal_command(unit), stdout=subprocess.PIPE, text=True,
                               encoding="utf-8", errors="replace")
    return journal_lines(process.stdout)


def follow_file(path: str, poll_s: float = 0.05):
    """Lines appended to `path` from this call on (tail -f); a partial last line waits for its end."""
    handle = open(path, encoding="utf-8", errors="replace")
    handle.seek(0, 2)
    return _appended(handle, poll_s)


def _appended(handle, poll_s: float):
    partial = ""
    while True:
        chunk = handle.readline()
        if not chunk:
            time.sleep(poll_s)
            continue
        partial += chunk
        if partial.endswith("\n"):
            yield partial.rstrip("\n"), False
            partial = ""
