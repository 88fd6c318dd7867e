"""The processes that run plan's simulations: forked once, reused for every group and the pick."""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable
from typing import Any

MAX_WORKERS = 8
"""More processes than this buy nothing: a plan has at most 8 (precision, checkpointing) groups."""


class SimulationWorkers:
    """Forked processes that run the simulations (each is single-threaded Python).

    The same processes fit the groups and then re-simulate the pick, so the re-simulation runs
    warm: the first model build in a process imports the modeling code, peft and bitsandbytes
    (~4 s on this 2-core machine, measured).  The parent never builds a model itself before
    forking: those imports start native threads, and children forked after that deadlocked
    (measured).
    """

    def __init__(self, tasks: int) -> None:
        n = min(tasks, os.cpu_count() or 1, MAX_WORKERS)
        self._pool = None
        self.size = 1
        if n > 1 and os.environ.get("TRAINFIT_WORKERS") != "1":
            self._pool = multiprocessing.get_context("fork").Pool(n)
            self.size = n

    def map(self, fn: Any, items: list[Any], on_done: Callable[[int], None] | None = None
            ) -> list[Any]:
        """``on_done(n)``: called as the n-th result arrives (progress)."""
        results = []
        it = (fn(x) for x in items) if self._pool is None else \
            self._pool.imap(fn, items, chunksize=1)
        for x in it:
            results.append(x)
            if on_done is not None:
                on_done(len(results))
        return results

    def close(self) -> None:
        if self._pool is not None:
            self._pool.terminate()
            self._pool.join()
            self._pool = None
