"""A fake ``pynvml`` module (two GPUs, a process list) so the monitor is tested without a GPU."""

from __future__ import annotations

import types
from types import SimpleNamespace

GIB = 2**30
FOREIGN_PID = 1  # init: never a descendant of the test process

# A child that holds 96 MiB, every page touched so it is resident.
CHILD_CODE = ("import sys, time\n"
              "n = 96 * 2**20\n"
              "b = bytearray(n)\n"
              "b[::4096] = b'\\x01' * (n // 4096)\n"
              "sys.stdout.write('ready\\n'); sys.stdout.flush()\n"
              "time.sleep(60)\n")
CHILD_BYTES = 96 * 2**20


class FakeNVMLError(Exception):
    pass


def make_fake_pynvml(*, processes: dict[int, dict[str, list]] | None = None,
                     init_error: str | None = None) -> types.ModuleType:
    """Two GPUs: 0 reads everything; 1 has no power reading and no graphics-process list."""
    gpus = [
        {"name": "NVIDIA H100 80GB HBM3", "util": 87, "used": 40 * GIB, "total": 80 * GIB,
         "power_mw": 350_500, "clock": 1980},
        {"name": b"NVIDIA A10G", "util": 12, "used": 3 * GIB, "total": 24 * GIB,
         "power_mw": None, "clock": 1710},
    ]
    procs = processes or {}
    m = types.ModuleType("pynvml")
    m.NVMLError = FakeNVMLError
    m.NVML_CLOCK_SM = 1
    m.shutdowns = 0

    def init() -> None:
        if init_error:
            raise FakeNVMLError(init_error)

    def shutdown() -> None:
        m.shutdowns += 1

    def power(h: int) -> int:
        if gpus[h]["power_mw"] is None:
            raise FakeNVMLError("Not Supported")
        return gpus[h]["power_mw"]

    def listing(kind: str):
        def get(h: int) -> list:
            lst = procs.get(h, {}).get(kind)
            if lst is None:
                raise FakeNVMLError("Not Supported")
            return [SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in lst]
        return get

    m.nvmlInit = init
    m.nvmlShutdown = shutdown
    m.nvmlDeviceGetCount = lambda: len(gpus)
    m.nvmlDeviceGetHandleByIndex = lambda i: i
    m.nvmlDeviceGetName = lambda h: gpus[h]["name"]
    m.nvmlDeviceGetUUID = lambda h: f"GPU-{h}{h}{h}{h}-fake"
    m.nvmlDeviceGetUtilizationRates = lambda h: SimpleNamespace(gpu=gpus[h]["util"], memory=0)
    m.nvmlDeviceGetMemoryInfo = lambda h: SimpleNamespace(used=gpus[h]["used"], total=gpus[h]["total"],
                                                          free=gpus[h]["total"] - gpus[h]["used"])
    m.nvmlDeviceGetPowerUsage = power
    m.nvmlDeviceGetClockInfo = lambda h, clk: gpus[h]["clock"] if clk == m.NVML_CLOCK_SM else 0
    m.nvmlDeviceGetComputeRunningProcesses = listing("compute")
    m.nvmlDeviceGetGraphicsRunningProcesses = listing("graphics")
    return m
