"""Host readings through ``psutil``: RAM, swap, CPU, and the RSS of a process tree."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

# CpuWindow measures since its previous read; a window of a few milliseconds gives a number
# dominated by clock-tick rounding (the kernel counts in 10 ms ticks), so the first read waits
# until at least this much time has passed since the window opened.
MIN_CPU_WINDOW_S = 0.1

_GONE = (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied)


@dataclass(frozen=True)
class HostReading:
    """The host at one instant (measured by psutil; ``None`` = not known)."""

    ram_used_bytes: int
    ram_total_bytes: int
    swap_used_bytes: int
    cpu_percent: float          # all cores, 100 % = every core busy, since the previous reading
    process_rss_bytes: int | None  # the followed process tree; None when none is followed or it exited


# /proc/PID/task/TID/children (Linux >= 3.5 with CONFIG_PROC_CHILDREN) lists a thread's children: walking
# it reads only the followed tree's files. psutil's children(recursive=True) reads /proc/*/stat of every
# process on the host instead: measured 3.4 ms for 79 processes on this 2-core machine under load, most of
# the sampler's cost, partly under the GIL the training loop needs. The kernel documents the file as
# possibly missing a child created or reparented during the read; the next sample sees it.
_PROC_CHILDREN = Path(f"/proc/self/task/{os.getpid()}/children").exists()


def _descendant_pids(root: int) -> list[int] | None:
    """Descendants of ``root`` through /proc children files; None when a file cannot be read (fall back)."""
    out: list[int] = []
    seen = {root}
    todo = [root]
    while todo:
        pid = todo.pop()
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except FileNotFoundError:
            continue  # exited meanwhile
        except OSError:
            return None
        for tid in tids:
            try:
                with open(f"/proc/{pid}/task/{tid}/children") as f:
                    kids = [int(k) for k in f.read().split()]
            except FileNotFoundError:
                continue  # the thread or the process exited meanwhile
            except OSError:
                return None
            for k in kids:
                if k not in seen:
                    seen.add(k)
                    out.append(k)
                    todo.append(k)
    return out


def process_tree(pid: int, cache: dict[int, psutil.Process] | None = None) -> list[psutil.Process]:
    """``pid`` then all its descendants; empty when ``pid`` does not exist. Children may exit meanwhile.

    ``cache``: psutil.Process objects by pid, kept between calls (building one reads /proc/PID/stat).
    Reusing one is safe for reading: a pid is only looked up while it is listed as a child of the tree.
    """
    pids = _descendant_pids(pid) if _PROC_CHILDREN else None
    if pids is None:
        try:
            root = psutil.Process(pid)
            return [root, *root.children(recursive=True)]
        except _GONE:
            return []
    procs = []
    for p in (pid, *pids):
        proc = cache.get(p) if cache is not None else None
        if proc is None:
            try:
                proc = psutil.Process(p)
            except _GONE:
                if p == pid:
                    return []
                continue
            if cache is not None:
                cache[p] = proc
        procs.append(proc)
    if cache is not None and len(cache) > len(procs):
        alive = {p.pid for p in procs}
        for p in [p for p in cache if p not in alive]:
            del cache[p]
    return procs


def process_tree_pids(pid: int) -> set[int]:
    return {p.pid for p in process_tree(pid)}


def process_tree_rss_bytes(pid: int) -> int | None:
    """Sum of the resident set sizes of ``pid`` and its descendants (measured); ``None`` if ``pid`` is gone.

    A child that exits between the listing and its reading is skipped. RSS counts shared pages once per
    process (forked data-loader workers share the parent's pages copy-on-write), so the sum can exceed
    the physical memory the tree uses; it is what ``top`` and ``ps`` show. PSS would not double count
    but costs a read of every ``smaps`` file per sample, too slow for a 1 s sampler on a big tree.
    """
    return tree_rss_bytes(process_tree(pid))


def tree_rss_bytes(procs: list[psutil.Process]) -> int | None:
    """RSS sum of a list from :func:`process_tree` (root first); ``None`` if empty or the root is
    gone — a zombie too (exited, not yet reaped: it reads an RSS of 0, which an audit found
    logged as "process tree RSS 0.0 MiB (measured)" after the followed process ended)."""
    if not procs:
        return None
    try:
        if procs[0].status() == psutil.STATUS_ZOMBIE:
            return None
    except _GONE:
        return None
    total = 0
    for i, p in enumerate(procs):
        try:
            total += p.memory_info().rss
        except _GONE:
            if i == 0:  # the root itself exited after the listing
                return None
    return total


class CpuWindow:
    """The whole host's CPU use (100 % = every core busy) since the previous read, from
    ``psutil.cpu_times()`` deltas as ``psutil.cpu_percent`` computes it (busy = total − idle −
    iowait; guest time is already in user time).  Not ``psutil.cpu_percent(interval=None)``
    itself: psutil 7 keeps that window per thread, so one opened in the main thread and read
    in a sampler thread read 0 % on a host at 100 % (a QA run: monitor's first streamed
    sample, doctor's host watch)."""

    def __init__(self) -> None:
        self._last = psutil.cpu_times()

    @staticmethod
    def _busy_total(t: Any) -> tuple[float, float]:
        total = sum(t) - getattr(t, "guest", 0.0) - getattr(t, "guest_nice", 0.0)
        return total - t.idle - getattr(t, "iowait", 0.0), total

    def read(self) -> float:
        now = psutil.cpu_times()
        (b0, t0), (b1, t1) = self._busy_total(self._last), self._busy_total(now)
        self._last = now
        if t1 <= t0:
            return 0.0
        return max(0.0, min(100.0, 100.0 * (b1 - b0) / (t1 - t0)))


class HostProbe:
    """Reads the host each sample; keeps the CPU-percent window between samples."""

    def __init__(self, pid: int | None = None) -> None:
        self.pid = pid
        self._cpu = CpuWindow()  # opens the window; the first real value comes from read()
        self._primed_at = time.monotonic()
        self._first = True

    def read(self, tree: list[psutil.Process] | None = None) -> HostReading:
        """``tree``: the followed process tree when the caller already listed it (one listing per sample)."""
        if self._first:
            wait_s = MIN_CPU_WINDOW_S - (time.monotonic() - self._primed_at)
            if wait_s > 0:
                time.sleep(wait_s)
            self._first = False
        vm = psutil.virtual_memory()
        if self.pid is None:
            rss = None
        else:
            rss = tree_rss_bytes(tree if tree is not None else process_tree(self.pid))
        return HostReading(
            # used = total - available: what `free` calls "available" is what a new process can still
            # get without swapping; psutil's own `used` leaves out reclaimable caches inconsistently
            # across kernels, so the complement of `available` is the comparable number.
            ram_used_bytes=int(vm.total - vm.available),
            ram_total_bytes=int(vm.total),
            swap_used_bytes=int(psutil.swap_memory().used),
            cpu_percent=self._cpu.read(),
            process_rss_bytes=rss,
        )


def process_alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie, exited but not yet reaped by its parent, counts as gone)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except _GONE:
        return False
