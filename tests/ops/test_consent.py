"""One consent rule for every command that changes a host (shell.must_ask), with and without a
terminal and on a JSON channel; and the commands that change hosts all follow it."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from ddops.exits import BadInput
from ddops.shell import confirm, must_ask
from tests.fixtures_lab import REPO

TTY, PIPE = (lambda: True), (lambda: False)


def test_yes_or_a_dry_run_goes_ahead_unasked_anywhere():
    for tty in (TTY, PIPE):
        for machine in (False, True):
            assert must_ask(True, "deploy", machine=machine, is_tty=tty) is False
            assert must_ask(False, "deploy", machine=machine, dry_run=True, is_tty=tty) is False


def test_a_person_at_a_terminal_is_asked_and_no_means_nothing_changed():
    assert must_ask(False, "deploy", is_tty=TTY) is True
    confirm("Apply?", ask=lambda q: True)
    with pytest.raises(BadInput, match="declined at the prompt; nothing changed"):
        confirm("Apply?", ask=lambda q: False)


def test_without_a_terminal_or_on_a_json_channel_it_refuses_before_anything():
    with pytest.raises(BadInput, match="refusing to roll back without --yes: no terminal to confirm on"):
        must_ask(False, "roll back", is_tty=PIPE)
    with pytest.raises(BadInput, match="a JSON channel never prompts"):   # even at a terminal
        must_ask(False, "roll back", machine=True, is_tty=TTY)


@pytest.mark.parametrize("args", [
    ["deploy", "cpu-ar", "--host", "h"], ["rollback", "--host", "h"], ["recover", "--host", "h"],
    ["switch", "cpu-ar", "--host", "h"], ["shadow", "abort"], ["rollout", "plan.yaml"],
])
def test_every_command_that_changes_a_host_refuses_without_yes_and_a_terminal(args, tmp_path):
    (tmp_path / "inventory.yaml").write_text("hosts: {h: {address: 127.0.0.1, ssh_port: 9}}\n")
    (tmp_path / "plan.yaml").write_text("profile: cpu-ar\nhosts: [h]\n")
    done = subprocess.run([sys.executable, "-m", "ddops", *args, "--inventory", str(tmp_path / "inventory.yaml")],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
                          env={**os.environ, "DDOPS_STATE": str(tmp_path / "state"), "PYTHONPATH": str(REPO)})
    assert done.returncode == 2, done.stdout + done.stderr
    assert "--yes" in done.stderr + done.stdout
