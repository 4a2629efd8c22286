"""Push a model (or install the runtime) to many hosts at once, with a progress bar per host.

One thread and one SSH connection per host; local checksums are computed once. Each bar shows
the bytes the host still lacks (files already identical there are skipped; a partial upload
left by a killed push is resumed), the rate and the time left. A host that fails does not stop
the others: each outcome is reported.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from rich.console import Console
from rich.progress import (BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn,
                           TransferSpeedColumn)

from ddops.install.sync import local_checksums, local_files, model_dest, sync_files
from ddops.remote import connect


@dataclass(frozen=True)
class HostOutcome:
    host: str
    ok: bool
    detail: str
    report: object = None       # SyncReport / InstallReport when ok


def progress_bars(console: Console | None = None) -> Progress:
    return Progress(TextColumn("{task.description:<12}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
                    TimeRemainingColumn(), console=console or Console(stderr=True), transient=False)


def run_on_hosts(hosts: list, work: Callable, console: Console | None = None) -> list[HostOutcome]:
    """work(remote, tick) on every host in parallel; tick(total=..)/tick(advance=..) feeds its bar."""
    with progress_bars(console) as bars:
        def one(host) -> HostOutcome:
            task = bars.add_task(host.name, total=None)
            tick = lambda **kw: bars.update(task, **kw)  # noqa: E731
            try:
                with connect(host) as remote:
                    return HostOutcome(host.name, True, "ok", work(remote, tick))
            except Exception as exc:     # one host's failure is reported, the others go on
                bars.update(task, description=f"{host.name} FAILED")
                return HostOutcome(host.name, False, str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
        with ThreadPoolExecutor(max_workers=max(1, len(hosts))) as pool:
            return list(pool.map(one, hosts))


def push_model_many(hosts: list, directory: Path, dest: str | None = None,
                    console: Console | None = None) -> list[HostOutcome]:
    files = local_files(directory)
    sums = local_checksums(files)
    target = model_dest(directory, dest)
    return run_on_hosts(hosts, lambda remote, tick: sync_files(remote, files, target, log=lambda _: None,
                                                               progress=tick, local_sums=sums), console)
