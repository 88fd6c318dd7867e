"""Progress of a long computation on stderr: a rich progress bar on a terminal, and when piped one
line per stage plus one every :data:`HEARTBEAT_S` seconds of silence (a log shows it is alive).

Both start their thread (rich's refresh, the heartbeat) at the first report, not before: plan
forks its simulation workers first, and a process forked while another thread holds a lock (the
stderr buffer's, say) can deadlock in the child."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

HEARTBEAT_S = 15.0
"""Piped: a line when nothing was printed for this long."""

Report = Callable[[str, int, int], None]
"""(what is being done, done, total)."""


@contextmanager
def stage_progress(command: str, *, enabled: bool = True) -> Iterator[Report]:
    """A ``progress(what, done, total)`` callback for the duration of the block (stderr)."""
    if not enabled:
        yield lambda what, done, total: None
        return
    if sys.stderr.isatty():
        with _rich(command) as report:
            yield report
        return
    with _lines(command) as report:
        yield report


@contextmanager
def _rich(command: str) -> Iterator[Report]:
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        SpinnerColumn,
        TextColumn,
        TimeElapsedColumn,
    )

    bar = Progress(SpinnerColumn(), TextColumn(f"{command}: {{task.description}}"),
                   BarColumn(bar_width=20),
                   MofNCompleteColumn(), TimeElapsedColumn(), console=Console(stderr=True),
                   transient=True)
    task = bar.add_task("starting", total=None)
    started = False

    def report(what: str, done: int, total: int) -> None:
        nonlocal started
        if not started:
            bar.start()
            started = True
        bar.update(task, description=what, completed=done, total=total)
    try:
        yield report
    finally:
        if started:
            bar.stop()


@contextmanager
def _lines(command: str) -> Iterator[Report]:
    t0 = time.monotonic()
    state = {"last": t0, "what": "starting", "done": 0, "total": 0}
    lock = threading.Lock()
    stop = threading.Event()

    def line(what: str, done: int, total: int) -> None:
        now = time.monotonic()
        print(f"{command}: {what} {done}/{total} ({now - t0:.0f} s)", file=sys.stderr, flush=True)
        state["last"] = now

    th = threading.Thread(target=lambda: beat(), name="trainfit-progress", daemon=True)

    def report(what: str, done: int, total: int) -> None:
        if not th.is_alive() and not stop.is_set():
            th.start()
        with lock:
            if (what, done, total) != (state["what"], state["done"], state["total"]):
                state.update(what=what, done=done, total=total)
                line(what, done, total)

    def beat() -> None:
        while not stop.wait(1.0):
            with lock:
                if time.monotonic() - state["last"] >= HEARTBEAT_S:
                    line(f"still at: {state['what']}", int(state["done"]), int(state["total"]))

    try:
        yield report
    finally:
        stop.set()
        if th.is_alive():
            th.join()
