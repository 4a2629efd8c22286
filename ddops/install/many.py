"""Push a model (or install the runtime) to many hosts at once, with a progress bar per host.

One SSH connection per host, in a process of its own for model pushes (a thread for
install-runtime, whose time goes to pip on the host); local checksums are computed once. Each bar shows
the bytes the host still lacks (files already identical there are skipped; a partial upload
left by a killed push is resumed), the rate and the time left. A host that fails does not stop
the others: each outcome is reported.
"""

from __future__ import annotations

import multiprocessing
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from queue import Empty
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from rich.console import Console
from rich.progress import (BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn,
                           TransferSpeedColumn)

from ddops import exits
from ddops.install.sync import Transfer, local_checksums, local_files, model_dest, preview_sync, sync_files
from ddops.remote import connect


@dataclass(frozen=True)
class HostOutcome:
    host: str
    ok: bool
    detail: str
    report: object = None       # SyncReport / InstallReport when ok
    code: int = exits.OK        # the failure's exit code (ddops.exits: its cause's)


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
                return HostOutcome(host.name, False, str(exc).splitlines()[0] if str(exc) else type(exc).__name__,
                                   code=exits.code_of(exc))
        with ThreadPoolExecutor(max_workers=max(1, len(hosts))) as pool:
            return list(pool.map(one, hosts))


def push_model_many(hosts: list, directory: Path, dest: str | None = None,
                    console: Console | None = None, transfer: Transfer = Transfer()) -> list[HostOutcome]:
    """One process per host: SSH encryption and SFTP framing are Python work, so threads would
    share one interpreter lock; processes use every core."""
    files = local_files(directory)
    sums = local_checksums(files)
    return run_in_processes(hosts, _push_one, (files, model_dest(directory, dest), sums, transfer), console)


def preview_push_many(hosts: list, directory: Path, dest: str | None = None) -> list[HostOutcome]:
    """What a push would copy to each host (read only); its report's `copied` is what it lacks."""
    files = local_files(directory)
    sums, target = local_checksums(files), model_dest(directory, dest)
    return run_on_hosts(hosts, lambda remote, tick: preview_sync(remote, files, target, sums), Console(quiet=True))


def _push_one(host, files, target, sums, transfer):
    """Runs in a child process: one host's push, its progress sent to the parent's bars."""
    def tick(**update):
        _progress.put((host.name, update))
    with connect(host, ciphers=transfer.ciphers) as remote:
        return sync_files(remote, files, target, log=lambda _: None, progress=tick, local_sums=sums,
                          transfer=transfer)


_progress = None    # in a child process: the queue to the parent's bars (set by _listen)


def _listen(queue) -> None:
    """A worker's start: bound to the fork server (ddops/install/bound.py), its queue kept."""
    from ddops.install.bound import bind_to_parent
    global _progress
    bind_to_parent()
    _progress = queue


def run_in_processes(hosts: list, worker: Callable, args: tuple, console: Console | None = None) -> list[HostOutcome]:
    """worker(host, *args) in a process per host; it reports (host name, bar update) on _progress.
    Children fork from a server that imported this module once (forkserver, never a fork of this
    threaded process): a fresh interpreter per host cost ~0.5 CPU s of imports, and a Manager
    process for the queue another."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload([__name__, "ddops.install.bound"])    # the server dies with ddops
    queue = context.Queue()
    with progress_bars(console) as bars:
        tasks = {h.name: bars.add_task(h.name, total=None) for h in hosts}
        with ProcessPoolExecutor(max_workers=len(hosts), mp_context=context, initializer=_listen,
                                 initargs=(queue,)) as pool:
            futures = [(h, pool.submit(worker, h, *args)) for h in hosts]
            while not all(f.done() for _, f in futures):
                _drain(queue, bars, tasks, wait_s=0.1)
        _drain(queue, bars, tasks, wait_s=0)     # the children have exited: all they sent is here
        queue.close()
        return [_outcome(h, f, bars, tasks) for h, f in futures]


def _drain(queue, bars: Progress, tasks: dict, wait_s: float) -> None:
    try:
        name, update = queue.get(timeout=wait_s) if wait_s else queue.get_nowait()
    except Empty:
        return
    bars.update(tasks[name], **update)
    while True:
        try:
            name, update = queue.get_nowait()
        except Empty:
            return
        bars.update(tasks[name], **update)


def _outcome(host, future, bars: Progress, tasks: dict) -> HostOutcome:
    try:
        return HostOutcome(host.name, True, "ok", future.result())
    except Exception as exc:     # one host's failure is reported, the others went on
        bars.update(tasks[host.name], description=f"{host.name} FAILED")
        return HostOutcome(host.name, False, str(exc).splitlines()[0] if str(exc) else type(exc).__name__,
                           code=exits.code_of(exc))
