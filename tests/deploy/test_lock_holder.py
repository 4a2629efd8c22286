"""Whether a lock's holder is gone: only a holder of this machine can be checked from here, and
a pid counts as its holder only when that process started before the lock was taken."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

from ddops.deploy.lock import gone, process_start


def test_a_holder_on_another_machine_is_never_taken_for_gone():
    assert not gone({"machine": socket.gethostname() + "-elsewhere", "pid": 999_999_999, "since": time.time()})
    assert not gone(None) and not gone({"machine": socket.gethostname(), "pid": "12"})


def test_a_live_holder_is_not_gone_and_a_dead_or_reused_pid_is():
    here = socket.gethostname()
    assert not gone({"machine": here, "pid": os.getpid(), "since": time.time()})
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    assert gone({"machine": here, "pid": child.pid, "since": time.time()})   # exited: no such process
    assert gone({"machine": here, "pid": os.getpid(), "since": process_start(os.getpid()) - 60})  # reused pid


def test_a_process_start_is_read_from_proc():
    before = time.time()
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert before - 1 <= process_start(child.pid) <= time.time() + 1
    finally:
        child.kill()
        child.wait()
    assert process_start(child.pid) is None
