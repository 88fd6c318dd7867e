"""The GPU-to-GPU link as the job's collectives see it, measured (tune under torchrun).

A catalog's PCIe or NVLink figure is what the slot or bridge could carry; what NCCL gets can be a
fraction of it — GeForce cards have PCIe peer-to-peer disabled, so NCCL stages through host
memory, and a card in an x4 slot or behind a slow chipset link runs at that (a 2× RTX 3090 FSDP
rig measured ~2.7 GB/s all-gather).  So tune measures it: an all-gather of FSDP-sized buffers
(``all_gather_into_tensor``, what FSDP runs per unit), 2 warm-up then 5 timed, the median, as
nccl-tests report bus bandwidth: (ranks − 1) / ranks × total bytes / time
(nccl-tests doc/PERFORMANCE.md).  ``trainfit plan --interconnect GBPS`` takes the number.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

LINK_BUFFER_BYTES = 64 * 2**20
"""Per-rank share of the gathered buffer: a 7B model's decoder layer in bf16 over 4 ranks."""


@dataclass(frozen=True)
class LinkMeasurement:
    bus_gbs: float
    """Median all-gather bus bandwidth, GB/s (1e9), as nccl-tests' busbw."""
    spread_gbs: float
    """Max − min of the timed repeats (the noise of the measurement)."""
    ranks: int
    backend: str


def measure_link(device: torch.device, repeats: int = 5) -> LinkMeasurement | None:
    """All ranks call it together (a collective); None without a process group of > 1 rank."""
    if not dist.is_initialized() or dist.get_world_size() < 2:
        return None
    n = dist.get_world_size()
    numel = LINK_BUFFER_BYTES // 2
    shard = torch.empty(numel, dtype=torch.bfloat16, device=device)
    out = torch.empty(numel * n, dtype=torch.bfloat16, device=device)
    group = None if device.type == "cuda" else dist.group.WORLD
    rates = []
    for i in range(2 + repeats):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        dist.barrier()
        t0 = time.perf_counter()
        dist.all_gather_into_tensor(out, shard, group=group)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        dt = time.perf_counter() - t0
        if i >= 2:
            rates.append((n - 1) / n * out.numel() * out.element_size() / dt / 1e9)
    # every rank reports the slowest rank's figure (the collective is as fast as its slowest)
    t = torch.tensor([statistics.median(rates), max(rates) - min(rates)], dtype=torch.float64)
    dist.all_reduce(t[:1], op=dist.ReduceOp.MIN)
    dist.all_reduce(t[1:], op=dist.ReduceOp.MAX)
    return LinkMeasurement(bus_gbs=float(t[0]), spread_gbs=float(t[1]), ranks=n,
                           backend=str(dist.get_backend()))
