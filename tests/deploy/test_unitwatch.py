"""The host side of the unit watch: the long-poll shell, run by a real sh against a stand-in
`systemctl` that prints a state file (the lab deploy tests run it against real systemd, through
sudo and a bastion)."""

from __future__ import annotations

import subprocess

from ddops.deploy.facts import UnitState
from ddops.deploy.unitwatch import long_poll

RUNNING = "ActiveState=active\nSubState=running\nNRestarts=0\nExecMainPID=41"
RESTARTING = "ActiveState=activating\nSubState=auto-restart\nNRestarts=1\nExecMainPID=0"


def _host(tmp_path, state: str):
    (tmp_path / "state").write_text(state + "\n")
    fake = tmp_path / "systemctl"
    fake.write_text(f"#!/bin/sh\ncat {tmp_path / 'state'}\n")
    fake.chmod(0o755)
    return {"PATH": f"{tmp_path}:/usr/bin:/bin"}


def _poll(env, last: str, wait_s: float) -> str:
    done = subprocess.run(["sh", "-c", long_poll("ddx.service", last, wait_s, 0.05)], env=env,
                          capture_output=True, text=True, timeout=20)
    assert done.returncode == 0, done.stderr
    return done.stdout.rstrip("\n")


def test_a_quiet_unit_answers_its_unchanged_state_when_the_wait_ends(tmp_path):
    assert _poll(_host(tmp_path, RUNNING), RUNNING, 0.3) == RUNNING


def _host_changing_at(tmp_path, call: int, before: str, after: str):
    """A stand-in `systemctl` that counts its calls and prints `after` from call number `call` on."""
    (tmp_path / "before").write_text(before + "\n")
    (tmp_path / "after").write_text(after + "\n")
    (tmp_path / "calls").write_text("0\n")
    fake = tmp_path / "systemctl"
    fake.write_text(f"#!/bin/sh\nn=$(($(cat {tmp_path / 'calls'}) + 1)); echo $n > {tmp_path / 'calls'}\n"
                    f"if [ $n -ge {call} ]; then cat {tmp_path / 'after'}; else cat {tmp_path / 'before'}; fi\n")
    fake.chmod(0o755)
    return {"PATH": f"{tmp_path}:/usr/bin:/bin"}


def test_a_change_during_the_wait_is_answered_at_once_not_at_the_deadline(tmp_path):
    env = _host_changing_at(tmp_path, 4, RUNNING, RESTARTING)
    answer = _poll(env, RUNNING, 15.0)  # a 15 s wait in 0.05 s steps is 301 reads of the unit
    assert UnitState.parse(answer) == UnitState.parse(RESTARTING)
    assert int((tmp_path / "calls").read_text()) == 4  # it answered at the first read that saw the change


def test_a_change_between_polls_is_answered_without_waiting(tmp_path):
    env = _host(tmp_path, RESTARTING)
    assert UnitState.parse(_poll(env, RUNNING, 15.0)).restarts == 1


def test_quotes_in_the_last_answer_reach_the_comparison_intact(tmp_path):
    odd = RUNNING + "\nDescription=it's \"odd\" $HOME `x`"
    assert _poll(_host(tmp_path, odd), odd, 0.2) == odd


def test_a_failing_systemctl_ends_the_poll_with_its_status(tmp_path):
    env = _host(tmp_path, RUNNING)
    (tmp_path / "systemctl").write_text("#!/bin/sh\necho 'Failed to connect to bus' >&2\nexit 1\n")
    done = subprocess.run(["sh", "-c", long_poll("ddx.service", RUNNING, 15.0, 0.05)], env=env,
                          capture_output=True, text=True, timeout=20)
    assert done.returncode == 1 and "Failed to connect to bus" in done.stderr and done.stdout == ""


class _QuietLink:
    """A remote whose long-poll never answers while its transport stays up: a dropped link or a
    frozen host, as the watch sees them (the real ones: tests/rollout/test_lab_faults.py)."""
    label = "quiet"

    class _Channel:
        closed = False

        def shutdown_write(self):
            pass

        def exit_status_ready(self):
            return False

        def get_transport(self):
            return self

        def is_active(self):
            return True

        def close(self):
            self.closed = True

    def open_channel(self, command):
        return self._Channel()


def test_a_quiet_link_is_ridden_out_with_the_last_state_then_counts_as_lost(monkeypatch):
    import time

    import pytest

    from ddops.deploy import unitwatch
    from ddops.remote.session import ConnectionLost
    monkeypatch.setattr(unitwatch, "GRACE_S", 0.0)
    watch = unitwatch.UnitWatch(_QuietLink(), "ddx.service", shown=RUNNING, wait_s=0.1, ride_s=0.4)
    assert watch() == UnitState.parse(RUNNING)          # the poll starts
    time.sleep(0.25)                                    # past the poll's own wait: the link is quiet
    assert watch() == UnitState.parse(RUNNING)          # ridden: the last state, no error
    time.sleep(0.35)
    with pytest.raises(ConnectionLost, match="no answer in"):
        watch()
