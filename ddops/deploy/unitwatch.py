"""Watching a unit while a gate waits for its health: one long-poll on the host at a time.

Asking `systemctl show` every half second costs one SSH round trip per ask. Instead the host
waits: one command re-reads the unit's state every STEP_S and answers as soon as it differs
from the last state ddops saw, or after WAIT_S with the same state. The gate keeps probing HTTP
meanwhile (the poll runs on its own SSH channel), so a service that turns healthy is gated as
fast as before, a crash or restart is seen within STEP_S plus a round trip, and a quiet unit
costs one command per WAIT_S.

A poll that does not answer within WAIT_S + GRACE_S finds the link quiet: a dropped link or a
frozen host, whose packets TCP sends again once it is back. While the transport stands, the
watch rides that out for up to RIDE_S, answering the last state it saw (the gate's HTTP probes
fail meanwhile, and its own deadlines still hold); past RIDE_S, or once the transport is gone,
it is ConnectionLost, as for any command. Before, a quiet link of 10 s ended the watch: a
switch, rollback or promote whose restart met a 30 s freeze or a 45 s drop exited 3 with the
host half changed (`python -m ddops.lab.faults`, 2026-12-07: 17 of 25 drop and freeze cases;
0 of 30 with the ride).
"""

from __future__ import annotations

import math
import time

from ddops import systemd
from ddops.deploy.facts import UnitState, unit_show
from ddops.remote.become import collect
from ddops.remote.session import LOST, CommandFailed, ConnectionLost

WAIT_S = 4.0     # longest a poll stays on the host with nothing changed
STEP_S = 0.2     # how often the host re-reads the state
GRACE_S = 6.0    # round trip and sudo on top of WAIT_S before the link counts as quiet
RIDE_S = 90.0    # how long a quiet link is ridden out (a watch's poll, a gate's request) before it counts as lost


def long_poll(unit: str, last: str, wait_s: float = WAIT_S, step_s: float = STEP_S) -> str:
    """Shell that prints the unit's `systemctl show` text once it differs from `last` (the
    text of the last answer, trailing newlines stripped) or after wait_s; a failing
    `systemctl show` ends it with systemctl's exit status."""
    steps = max(1, math.ceil(wait_s / step_s))
    return (f"last={systemd.q(last)}; i=0; "
            f"while now=$({unit_show(unit)}) || exit; [ \"$now\" = \"$last\" ] && [ $i -lt {steps} ]; "
            f"do sleep {step_s}; i=$((i+1)); done; printf '%s\\n' \"$now\"")


class UnitWatch:
    """Callable the gate asks for the unit's state: the first call reads it (one command) unless
    `shown` (`unit_show` output the caller already has) gives it; later calls return the newest
    state a long-poll brought back, never blocking."""

    def __init__(self, remote, unit: str, shown: str | None = None, wait_s: float = WAIT_S,
                 ride_s: float = RIDE_S):
        self.remote, self.unit, self.wait_s, self.ride_s = remote, unit, wait_s, ride_s
        self._text: str | None = None
        self._state = UnitState()
        if shown:
            self._take(shown)
        self._chan = None
        self._since = 0.0

    def __enter__(self) -> "UnitWatch":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __call__(self) -> UnitState:
        if self._text is None:
            self._take(self.remote.run(unit_show(self.unit)).stdout)
        elif self._chan is None:
            self._start()
        elif self._answered():
            self._take(self._collect())
            self._start()
        elif time.monotonic() - self._since > self.wait_s + GRACE_S + self.ride_s:
            raise ConnectionLost(f"{self.remote.label}: watching {self.unit}: no answer in "
                                 f"{self.wait_s + GRACE_S + self.ride_s:.0f} s: connection lost")
        return self._state

    def close(self) -> None:
        """Drop the poll in flight (the host ends it within wait_s)."""
        if self._chan is not None:
            self._chan.close()
            self._chan = None

    def _take(self, text: str) -> None:
        self._text = text.rstrip("\n")
        self._state = UnitState.parse(self._text)

    def _start(self) -> None:
        self._chan = self.remote.open_channel(long_poll(self.unit, self._text, self.wait_s))
        self._chan.shutdown_write()
        self._since = time.monotonic()

    def _answered(self) -> bool:
        chan = self._chan
        try:
            if chan.exit_status_ready():
                return True
            if chan.closed or not chan.get_transport().is_active():
                raise ConnectionLost(f"{self.remote.label}: watching {self.unit}: connection lost")
        except LOST as exc:
            raise ConnectionLost(f"{self.remote.label}: watching {self.unit}: connection lost: {exc}") from None
        return False

    def _collect(self) -> str:
        chan, self._chan = self._chan, None
        try:
            status, out, err = collect(chan)
        finally:
            chan.close()
        if status != 0:
            reason = err.strip().splitlines()[-1:] or ["(no output)"]
            raise CommandFailed(f"{self.remote.label}: watching {self.unit}: exited {status}: {reason[0]}")
        return out
