"""The one table of ddops exit codes, and the one mapping from a cause of failure to its code.

Every command ends with one of the codes; its JSON document carries the code and its meaning
(docs/ci.md). A failure that ends a command is an exception whose class names its cause (one
class per cause below; ddops's own errors subclass them: ConfigError is a BadInput, LockHeld a
Locked, a failed connect an Unreachable); `CAUSES` gives each cause its code, and `ddops.shell`
reads nothing else. Verdicts a command returns in its document (a gate failed and was reverted,
a rollout paused) use the codes directly. As Fabric does, a command that exited non-zero
(HostFailed) is kept apart from a connection that failed (Unreachable before it opened,
ConnectionLost after)."""

from __future__ import annotations

from typing import Iterable

OK = 0
FAILED = 1            # the change failed its gate and was reverted (`fit`: does not fit)
BAD_INPUT = 2         # refused before any host changed: bad input, or a knowable-bad change
NEEDS_OPERATOR = 3    # a revert failed, SSH was lost mid-change, or a host failed a step: look at it
LOCKED = 4            # another ddops holds the host's lock
PAUSED = 5            # a rollout stopped for approval: `--approve` continues, `--abort` reverts
UNREACHABLE = 6       # a host could not be reached: no connection opened, so nothing on it changed
INTERNAL = 70         # a bug in ddops (sysexits' EX_SOFTWARE), never a verdict on a host: rerun with --debug
INTERRUPTED = 130     # Ctrl-C: in-flight hosts finished and were recorded; run again to resume

MEANING = {OK: "success", FAILED: "gate failed and reverted", BAD_INPUT: "bad input",
           NEEDS_OPERATOR: "host needs an operator (revert failed, SSH lost mid-change or a step failed on it)",
           LOCKED: "lock held", PAUSED: "paused for approval",
           UNREACHABLE: "host unreachable, nothing changed", INTERNAL: "internal error (a bug in ddops)",
           INTERRUPTED: "interrupted; run again to resume"}

# how serious a code is when several hosts end differently: the last of these wins
SEVERITY = (OK, BAD_INPUT, LOCKED, FAILED, UNREACHABLE, NEEDS_OPERATOR, INTERNAL)


def meaning(code: int) -> str:
    return MEANING.get(code, "error")


def worst(codes: Iterable[int]) -> int:
    """The most serious of several hosts' codes (OK when there are none)."""
    return max(codes, key=lambda c: SEVERITY.index(c) if c in SEVERITY else len(SEVERITY), default=OK)


class Failure(Exception):
    """A failure ddops expects. `hint` (a class may set one) replaces its cause's hint; `fields`
    (set by the raiser) join the command's JSON document beside `error`."""

    hint: str = ""
    fields: dict = {}


class BadInput(Failure):
    """Refused before any host changed: a profile, option, file or inventory entry is wrong."""


class Unreachable(Failure):
    """No connection to a host could be opened (no route, refused, host key, login): nothing ran."""


class ConnectionLost(Failure):
    """An open connection to a host dropped: a change in flight may be half-applied."""


class HostFailed(Failure):
    """A step on a host failed where ddops needed it to succeed: a command exited non-zero or ran
    past its time, an upload arrived corrupted, a lab host did not boot."""


class RevertFailed(Failure):
    """A failed change could not be undone; the message says what the host holds now."""


class Locked(Failure):
    """Another ddops holds the host's deploy lock; nothing was changed there."""


STATUS_HINT = "`ddops status --host NAME` shows what it runs"
CAUSES: tuple[tuple[type[Failure], int, str], ...] = (   # first match wins
    (BadInput, BAD_INPUT, ""),
    (Locked, LOCKED, "wait for the holder to finish: " + STATUS_HINT),
    (Unreachable, UNREACHABLE, "nothing was changed; check the host is up and its inventory entry "
                               "(address, ssh_port, ssh_user, ssh_key)"),
    (RevertFailed, NEEDS_OPERATOR, "`ddops status --host NAME`, then `ddops rollback --host NAME`"),
    (ConnectionLost, NEEDS_OPERATOR, "the host may be mid-change: " + STATUS_HINT),
    (HostFailed, NEEDS_OPERATOR, STATUS_HINT + "; `ddops diagnose --host NAME` reads its journal"),
)


def cause_of(exc: BaseException) -> tuple[int, str] | None:
    """(exit code, hint) of an expected failure; None for anything else (a bug: INTERNAL)."""
    for cause, code, hint in CAUSES:
        if isinstance(exc, cause):
            return code, exc.hint or hint
    return None


def code_of(exc: BaseException) -> int:
    found = cause_of(exc)
    return INTERNAL if found is None else found[0]
