"""The GPU this machine has, as a plan target: NVML's name and total mapped to the catalog (peaks,
bandwidth, context size), and the memory free now — what other processes hold is not the job's.

``plan`` without ``--gpu`` on a machine with a GPU plans for this card, and says so, with the
numbers NVML gave (measured) beside the catalog's (published).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from trainfit.hardware.gpus import GpuSpec, find_gpu_by_device_name
from trainfit.monitor.nvml import Nvml


@dataclass(frozen=True)
class LocalGpu:
    index: int
    device_name: str
    """As NVML reports it (e.g. ``NVIDIA GeForce RTX 3060``)."""
    total_bytes: int
    """NVML's total (measured)."""
    used_bytes: int
    """In use now by every process and the driver (measured when the plan started)."""
    spec: GpuSpec | None
    """The catalog entry the name maps to, with the capacity set to what is free now; None when
    the card is not in the catalog (the plan then needs --gpu or a generic-<N>gb)."""

    @property
    def free_bytes(self) -> int:
        return max(self.total_bytes - self.used_bytes, 0)


def local_gpu(index: int = 0, nvml: Nvml | None = None) -> LocalGpu | None:
    """The GPU ``index`` (default the first), or None when NVML sees no GPU (no driver, none)."""
    nv = nvml or Nvml().open()
    try:
        if not nv.available or index not in nv.indices:
            return None
        r = nv.read([index])[0]
    finally:
        if nvml is None:
            nv.close()
    if r.name is None or r.memory_total_bytes is None:
        return None
    used = r.memory_used_bytes or 0
    spec = find_gpu_by_device_name(r.name, r.memory_total_bytes)
    if spec is not None:
        free = max(r.memory_total_bytes - used, 0)
        # capacity = free now: memory another process holds cannot be the job's; the CUDA context
        # the job will create is part of its predicted device peak, as on an empty card
        spec = dataclasses.replace(
            spec, memory_bytes=free,
            memory_source=f"NVML on this machine: {r.name!r}, {r.memory_total_bytes} B total, "
                          f"{used} B in use by other processes and the driver when planned "
                          f"(measured); capacity = the {free} B free")
    return LocalGpu(index=index, device_name=r.name, total_bytes=r.memory_total_bytes,
                    used_bytes=used, spec=spec)
