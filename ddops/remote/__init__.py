"""The SSH boundary: the only package that imports Fabric (and paramiko).

`connect(host)` opens one verified connection and wraps it in a `Remote`; everything else takes
a Remote as an argument and runs commands and file operations as root through it (directly, or
through sudo when the inventory says `become: sudo`).

  session.py    Remote: run, read, write (atomic, mode and owner), channels; its errors, one
                class per cause (Unreachable, ConnectionLost, CommandFailed, BadSetup)
  framing.py    several answers in one remote read, which no content can confuse
  become.py     sudo wrapping, password on stdin only
  sshconfig.py  inventory + ~/.ssh/config (alias, HostName, Port, User, IdentityFile, ProxyJump)
  connect.py    keys and agent, host-key checking, `hosts trust` support
"""

from ddops.remote.connect import connect, fingerprint, host_key, known_hosts_of, recorded_keys, setup
from ddops.remote.session import (BadSetup, CommandFailed, ConnectionLost, Remote, RemoteError, Result,
                                  Unreachable, last_line, short)

__all__ = ["BadSetup", "CommandFailed", "ConnectionLost", "Remote", "RemoteError", "Result", "Unreachable",
           "connect", "fingerprint", "host_key", "known_hosts_of", "last_line", "recorded_keys", "setup", "short"]
