"""Processes a push starts die with the ddops that started them (Linux PR_SET_PDEATHSIG).

`run_in_processes` (many.py) forks each host's push from a fork server. Killed with SIGKILL, ddops
left them behind: `python -m ddops.lab.faults --fault kill --commands push-model` found the
resource tracker, the server and a host's worker still running after 4 of 5 kills, orphaned. The
server imports this module once at its start (its preload list), so it is bound to ddops; each
worker binds itself to the server (`bind_to_parent`, in the pool's initializer). Killed, ddops
takes the server with it, and the server its workers; the resource tracker then sees its pipe
close and ends too (0 left after kills at 2, 3 and 4 s into a push).
"""

from __future__ import annotations

import ctypes
import os
import signal

PR_SET_PDEATHSIG = 1        # <linux/prctl.h>


def bind_to_parent() -> None:
    """SIGKILL this process when the thread that forked it ends; exit now if that already happened."""
    parent = os.getppid()
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:      # the parent died before the binding took: nothing will signal us
        os._exit(1)


bind_to_parent()    # on import: only the fork server imports this module (many.py's preload)
