"""NVML readings through ``pynvml`` (the ``nvidia-ml-py`` package): never by parsing ``nvidia-smi`` text.

Every reading that NVML refuses (not supported on this board, a driver error, a GPU that fell off the bus)
becomes ``None`` for that one reading; the other readings of the same GPU are still returned. When NVML
cannot start at all (no driver, no library, no GPU) the probe says so: ``available=False`` and ``reason``.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class GpuReading:
    """One GPU at one instant (measured by NVML; ``None`` = NVML could not say)."""

    index: int
    name: str | None
    util_percent: float | None          # % of the last sample period a kernel ran (NVML's definition)
    memory_used_bytes: int | None       # device memory in use, all processes + driver reservations
    memory_total_bytes: int | None
    power_w: float | None
    sm_clock_mhz: int | None
    process_memory_bytes: int | None    # used by the followed process tree; None when none is followed


def _safe(fn: Callable[[], T]) -> T | None:
    # Any exception, not only NVMLError: old bindings raise NVMLError_FunctionNotFound, ctypes errors or
    # AttributeError for calls the installed driver lacks, and a monitor must never stop the training.
    try:
        return fn()
    except Exception:
        return None


def _text(value: Any) -> str:
    # pynvml < 11.5 returns bytes for names, later versions str.
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


class Nvml:
    """Handle to NVML for the life of a monitor: ``open()`` once, ``read()`` per sample, ``close()``."""

    def __init__(self) -> None:
        self.available = False
        self.reason: str | None = "not opened"
        self._nv: Any = None
        self._handles: dict[int, Any] = {}
        self.names: dict[int, str | None] = {}
        self.lost: set[int] = set()
        """GPUs NVML said are lost (fallen off the bus, Xid 79): their readings are None from
        then on, which is not a reading the card lacks (an audit: the two read the same)."""

    def open(self) -> Nvml:
        try:
            # Imported here, not at module import: a host without the package can still use the monitor.
            nv = importlib.import_module("pynvml")
        except ImportError as e:
            self.available, self.reason = False, f"pynvml not importable ({e})"
            return self
        if nv is None:  # sys.modules entry set to None: the import machinery's "not installed"
            self.available, self.reason = False, "pynvml not importable"
            return self
        try:
            nv.nvmlInit()
        except Exception as e:
            self.available, self.reason = False, str(e) or type(e).__name__
            return self
        self._nv = nv
        try:
            count = int(nv.nvmlDeviceGetCount())
        except Exception as e:
            self.close()
            self.available, self.reason = False, f"device count failed: {e}"
            return self
        for i in range(count):
            handle = _safe(lambda i=i: nv.nvmlDeviceGetHandleByIndex(i))
            if handle is not None:
                self._handles[i] = handle
                self.names[i] = _safe(lambda h=handle: _text(nv.nvmlDeviceGetName(h)))
        if not self._handles:
            self.close()
            self.available, self.reason = False, f"NVML started but found {count} usable GPU(s)"
            return self
        self.available, self.reason = True, None
        return self

    @property
    def indices(self) -> list[int]:
        return sorted(self._handles)

    def mig_enabled(self, index: int) -> bool:
        """True when GPU ``index`` is in MIG mode: CUDA programs get a slice of it, whose memory
        is not the card's that NVML reads (False where NVML cannot say: no MIG on the card)."""
        mode = _safe(lambda: self._nv.nvmlDeviceGetMigMode(self._handles[index]))
        return bool(mode and mode[0])

    def uuid_index(self, uuid: str) -> int | None:
        """The index of the GPU whose UUID starts with ``uuid`` (CUDA_VISIBLE_DEVICES may name a
        GPU by its UUID or a unique prefix of it); None when none or several match."""
        found = [i for i, h in self._handles.items()
                 if (_text(_safe(lambda h=h: self._nv.nvmlDeviceGetUUID(h)) or "")).startswith(uuid)]
        return found[0] if len(found) == 1 else None

    def close(self) -> None:
        if self._nv is not None:
            _safe(self._nv.nvmlShutdown)
        self._nv = None
        self._handles = {}

    def read(self, indices: Iterable[int] | None = None, pids: set[int] | None = None) -> list[GpuReading]:
        """One reading per GPU in ``indices`` (default: all). ``pids``: the followed process tree."""
        if not self.available or self._nv is None:
            return []
        wanted = self.indices if indices is None else [i for i in indices if i in self._handles]
        return [self._read_one(i, pids) for i in wanted]

    def _read_one(self, index: int, pids: set[int] | None) -> GpuReading:
        nv, h = self._nv, self._handles[index]
        util = _safe(lambda: float(nv.nvmlDeviceGetUtilizationRates(h).gpu))
        try:
            mem = nv.nvmlDeviceGetMemoryInfo(h)
        except Exception as e:  # every card reads its memory: an error here says why
            mem = None
            if getattr(e, "value", None) == getattr(nv, "NVML_ERROR_GPU_IS_LOST", 15):
                self.lost.add(index)
        used = _safe(lambda: int(mem.used)) if mem is not None else None
        total = _safe(lambda: int(mem.total)) if mem is not None else None
        power_mw = _safe(lambda: nv.nvmlDeviceGetPowerUsage(h))  # NVML reports milliwatts
        clock = _safe(lambda: int(nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM)))
        proc = self._process_memory_bytes(h, pids) if pids is not None else None
        return GpuReading(index=index, name=self.names.get(index), util_percent=util,
                          memory_used_bytes=used, memory_total_bytes=total,
                          power_w=None if power_mw is None else float(power_mw) / 1000.0,
                          sm_clock_mhz=clock, process_memory_bytes=proc)

    def _process_memory_bytes(self, handle: Any, pids: set[int]) -> int | None:
        """GPU memory used by ``pids`` on this GPU: compute and graphics contexts, each pid counted once.

        A process with both a compute and a graphics context is listed twice with the same memory, hence
        one value per pid. ``None`` (unknown, never a measured 0 — a review) when NVML cannot list the
        compute contexts (a training process's is one), lists one of our processes without a number
        (WDDM), or lists only pids that do not exist here: inside a container NVML lists the host's pids,
        which never match ours.
        """
        import psutil

        nv = self._nv
        lists = [_safe(lambda: nv.nvmlDeviceGetComputeRunningProcesses(handle)),
                 _safe(lambda: nv.nvmlDeviceGetGraphicsRunningProcesses(handle))]
        if lists[0] is None:
            return None
        per_pid: dict[int, int | None] = {}
        listed: set[int] = set()
        for lst in lists:
            for p in lst or []:
                pid = _safe(lambda p=p: int(p.pid))
                if pid is not None:
                    listed.add(pid)
                if pid is None or pid not in pids:
                    continue
                used = getattr(p, "usedGpuMemory", None)
                known = per_pid.get(pid, 0)
                per_pid[pid] = None if used is None or known is None else max(known, used)
        if any(v is None for v in per_pid.values()):
            return None  # one of ours without a number: a sum of the rest would be a wrong total
        if not per_pid and listed and not any(psutil.pid_exists(pid) for pid in listed):
            return None  # another pid namespace's processes (a container): ours cannot be told
        return sum(int(v) for v in per_pid.values() if v is not None)
