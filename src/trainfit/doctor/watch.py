"""The sampler the doctor runs beside a job: host RAM, swapping, the process tree's RSS and — where
NVML sees a GPU — its utilisation, every ``interval_s`` in a background thread.

Its own cost is measured (the thread's CPU time) and added to the doctor's overhead.
"""

from __future__ import annotations

import os
import statistics
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from trainfit.monitor.host import CpuWindow, process_tree, tree_rss_bytes
from trainfit.monitor.nvml import Nvml
from trainfit.speed.host_timing import BUSY_SHARE, LoadMeter, allowed_cpus

PAGE_BYTES = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def _swap_pages() -> tuple[int, int] | None:
    """(pages swapped in, pages swapped out) since boot (Linux /proc/vmstat), None elsewhere."""
    try:
        text = Path("/proc/vmstat").read_text()
    except OSError:
        return None
    vals = dict(line.split(" ", 1) for line in text.splitlines() if " " in line)
    try:
        return int(vals["pswpin"]), int(vals["pswpout"])
    except (KeyError, ValueError):
        return None


@dataclass(kw_only=True)
class HostSummary:
    """What the sampler measured over the run."""

    wall_s: float
    swap_in_bytes_per_s: float | None
    swap_out_bytes_per_s: float | None
    swap_used_bytes: int
    min_available_bytes: int
    ram_total_bytes: int
    peak_rss_bytes: int | None
    """The followed process tree (data-loader workers included)."""
    gpu_util_percent: float | None
    """Mean NVML utilisation of the GPUs the process used (None: no GPU / no NVML)."""
    cpu_percent: float | None
    """Mean host CPU use, 100 = every core busy."""
    sampler_cpu_s: float
    """CPU seconds the sampler itself used (part of the doctor's overhead)."""
    others_cores: float | None = None
    """Cores other processes (and a hypervisor's steal) used on this process's CPUs over the
    run, per second of it (measured: the CPUs' busy time less the watched tree's own); None
    where it could not be read (a command's tree gone before the end)."""
    cpus: int = 1
    """CPUs this process may run on (its affinity)."""

    @property
    def busy(self) -> bool:
        """Other processes took more than ``BUSY_SHARE`` of the CPUs (speed/host_timing.py: a
        quarter of a core on 2 cores slowed a step 1.9-2.4× with torch's pool at 2 threads)."""
        return self.others_cores is not None and self.others_cores > BUSY_SHARE * self.cpus


class HostWatch:
    def __init__(self, pid: int | None = None, interval_s: float = 1.0) -> None:
        self.pid = pid or os.getpid()
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._avail: list[int] = []
        self._rss: list[int] = []
        self._gpu: list[float] = []
        self._cpu: list[float] = []
        self._cpu_s = 0.0
        self._t0 = 0.0
        self._swap0: tuple[int, int] | None = None
        self._nvml: Any = None

    def __enter__(self) -> HostWatch:
        self._t0 = time.perf_counter()
        self._cpus = allowed_cpus()
        self._others = LoadMeter(self._cpus, tree_of=self.pid)  # the watched tree is not "other"
        self._swap0 = _swap_pages()
        self._cpu_window = CpuWindow()
        try:
            nv = Nvml().open()
            self._nvml = nv if nv.available else None
        except Exception:  # no NVML binding: no GPU numbers, never a failure
            self._nvml = None
        self._memory_sample()  # a watch shorter than its interval still has memory readings
        self._thread = threading.Thread(target=self._run, name="trainfit-doctor-watch", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        # and one at the end: a doctor round shorter than the interval had no RSS reading, and
        # the needless-recompute finding, which needs the peak, was dropped (a QA run)
        self._memory_sample()
        self._others_cores = self._others.measured()
        self._wall_s = time.perf_counter() - self._t0
        self._swap1 = _swap_pages()
        if self._nvml is not None:
            self._nvml.close()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            t = time.thread_time()
            self._sample()
            self._cpu_s += time.thread_time() - t

    def _memory_sample(self) -> list[Any]:
        """Available RAM and the tree's RSS now; returns the tree."""
        self._avail.append(int(psutil.virtual_memory().available))
        tree = process_tree(self.pid)
        rss = tree_rss_bytes(tree)
        if rss is not None:
            self._rss.append(rss)
        return tree

    def _sample(self) -> None:
        self._cpu.append(self._cpu_window.read())
        self._others.sample()  # the last reading while the watched tree lives
        tree = self._memory_sample()
        if self._nvml is not None:
            pids = {p.pid for p in tree}
            readings = self._nvml.read(pids=pids)
            used = [r for r in readings if r.process_memory_bytes]
            vals = [r.util_percent for r in (used or readings) if r.util_percent is not None]
            if vals:
                self._gpu.append(statistics.fmean(vals))

    def summary(self) -> HostSummary:
        wall = getattr(self, "_wall_s", time.perf_counter() - self._t0)
        s0, s1 = self._swap0, getattr(self, "_swap1", _swap_pages())
        swin = swout = None
        if s0 is not None and s1 is not None and wall > 0:
            swin = (s1[0] - s0[0]) * PAGE_BYTES / wall
            swout = (s1[1] - s0[1]) * PAGE_BYTES / wall
        vm = psutil.virtual_memory()
        return HostSummary(wall_s=wall, swap_in_bytes_per_s=swin, swap_out_bytes_per_s=swout,
                           swap_used_bytes=int(psutil.swap_memory().used),
                           min_available_bytes=min(self._avail) if self._avail else int(vm.available),
                           ram_total_bytes=int(vm.total),
                           peak_rss_bytes=max(self._rss) if self._rss else None,
                           gpu_util_percent=statistics.fmean(self._gpu) if self._gpu else None,
                           cpu_percent=statistics.fmean(self._cpu) if self._cpu else None,
                           sampler_cpu_s=self._cpu_s,
                           others_cores=getattr(self, "_others_cores", None),
                           cpus=len(self._cpus) or 1)


def busy_note(hosts: list[HostSummary], threads: int | None, what: str) -> str | None:
    """Said when other processes took a share of the CPUs a CPU step ran on (:attr:`HostSummary.
    busy`) during any of ``hosts`` (``what``: "rounds", "run"): the timings are then the
    contention's as much as the step's (a QA run: the same launch-bound job named compute-bound
    at 2 torch threads beside two busy loops, launch-bound at one; an audit: a script's
    input-bound loop named slow-optimizer, +68 %, beside two busy loops, with no word)."""
    busy = [h.others_cores for h in hosts if h.busy and h.others_cores is not None]
    if not busy:
        return None
    during = f"during {len(busy)} of the {len(hosts)} {what}" if len(hosts) > 1 else \
        f"during the {what}"
    pool = "" if threads is None else \
        f"torch ran {threads} thread{'s' if threads > 1 else ''}; "
    return (f"the host was busy: other processes used up to {max(busy):.1f} of "
            f"{hosts[0].cpus} CPU cores {during} (measured), so the step shared its cores: the "
            f"bottleneck named and any gain may differ on a quiet machine. {pool}no more torch "
            "threads than the free cores (torch.set_num_threads / OMP_NUM_THREADS) steadies the "
            "timings")
