"""The one table of ddops exit codes. Every command ends with one of these; the JSON document
of a command carries the code and its meaning (docs/ci.md)."""

from __future__ import annotations

OK = 0
FAILED = 1            # the change failed its gate and was reverted (`fit`: does not fit)
BAD_INPUT = 2         # refused before any host changed: bad input, or a knowable-bad change
NEEDS_OPERATOR = 3    # a revert failed or a host was lost mid-change: look at it
LOCKED = 4            # another ddops holds the host's lock
PAUSED = 5            # a rollout stopped for approval: `--approve` continues, `--abort` reverts
INTERNAL = 70         # a bug in ddops (sysexits' EX_SOFTWARE), never a verdict on a host: rerun with --debug
INTERRUPTED = 130     # Ctrl-C: in-flight hosts finished and were recorded; run again to resume

MEANING = {OK: "success", FAILED: "gate failed and reverted", BAD_INPUT: "bad input",
           NEEDS_OPERATOR: "revert failed, host needs an operator", LOCKED: "lock held",
           PAUSED: "paused for approval", INTERNAL: "internal error (a bug in ddops)", INTERRUPTED: "interrupted; run again to resume"}


def meaning(code: int) -> str:
    return MEANING.get(code, "error")
