"""The GPU this machine has, as a plan target: NVML's name and total mapped to the catalog (peaks,
bandwidth, context size), and the memory free now — what other processes hold is not the job's.

``plan`` without ``--gpu`` on a machine with a GPU plans for this card, and says so, with the
numbers NVML gave (measured) beside the catalog's (published).
"""

from __future__ import annotations

import dataclasses
import os
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


def cuda0_index(nv: Nvml) -> int | None:
    """NVML's index of the GPU a CUDA program gets as ``cuda:0``: the first entry of
    ``CUDA_VISIBLE_DEVICES`` (an index, or a ``GPU-`` UUID), else NVML's first. NVML numbers the
    cards in PCI order whatever that variable says (a review: under Slurm's
    ``CUDA_VISIBLE_DEVICES=5`` plan read GPU 0, another job's card). None when it cannot be told:
    no GPU visible (empty, ``-1``), or a MIG slice (``MIG-``, or a card in MIG mode: its memory
    is not the card's that NVML reads). Caveat: on a machine of mixed cards CUDA's default order
    is fastest first, which NVML's PCI order need not match (``CUDA_DEVICE_ORDER=PCI_BUS_ID``
    makes them one)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        first = "0"
    else:
        first = visible.split(",")[0].strip()
    if first.isdigit():
        index = int(first)
    elif first.startswith("GPU-"):
        index = nv.uuid_index(first)
    else:
        return None
    if index not in nv.indices or nv.mig_enabled(index):
        # a MIG-mode card gives CUDA a slice (Kubernetes names it in NVIDIA_VISIBLE_DEVICES,
        # not CUDA_VISIBLE_DEVICES): the card's memory would be read for it (a review)
        return None
    return index


def local_gpu(index: int | None = None, nvml: Nvml | None = None) -> LocalGpu | None:
    """The GPU ``index`` (NVML's; default the one CUDA programs get as ``cuda:0``:
    :func:`cuda0_index`), or None when NVML sees no GPU (no driver, none) or cannot tell which
    card that is."""
    nv = nvml or Nvml().open()
    try:
        if not nv.available:
            return None
        if index is None:
            index = cuda0_index(nv)
        if index is None or index not in nv.indices:
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


def own_gpu_bytes(uuid: str, nvml: Nvml | None = None) -> int | None:
    """The memory this process and its children hold on the GPU of ``uuid`` (NVML's per-process
    figure: CUDA context, PyTorch's reserve, other libraries' allocations), measured now; None
    when NVML cannot say (no NVML, another pid namespace, no per-process numbers)."""
    from trainfit.monitor.host import process_tree_pids

    nv = nvml or Nvml().open()
    try:
        index = nv.uuid_index(uuid) if nv.available else None
        if index is None:
            return None
        return nv.read([index], pids=process_tree_pids(os.getpid()))[0].process_memory_bytes
    finally:
        if nvml is None:
            nv.close()
