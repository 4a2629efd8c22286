"""Advisory file locks: one lab operation per state dir, one builder per cache entry (the lab
and the wheelhouse builders of ddops.install share them).

Several labs (a user's, a test session's) share $DDOPS_CACHE; without the lock two builders
could replace a tree another lab is booting from.
"""

import fcntl
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def file_lock(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
