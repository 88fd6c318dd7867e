"""Many ranks: torchrun's environment → a process group, DDP, and the collective decisions every
rank must take together (an OOM on one rank makes all ranks split; an interrupt stops all)."""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass
class Dist:
    rank: int = 0
    world: int = 1
    local_rank: int = 0

    @classmethod
    def from_env(cls) -> Dist:
        """Set up by torchrun / accelerate launch (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR…)."""
        world = int(os.environ.get("WORLD_SIZE", "1"))
        if world <= 1:
            return cls()
        d = cls(rank=int(os.environ["RANK"]), world=world,
                local_rank=int(os.environ.get("LOCAL_RANK", "0")))
        if not dist.is_initialized():
            backend = "nccl" if torch.cuda.is_available() else "gloo"
            if backend == "nccl":
                torch.cuda.set_device(d.local_rank)
            dist.init_process_group(backend)
        return d

    def wrap(self, model: torch.nn.Module, device: torch.device) -> torch.nn.Module:
        if self.world == 1:
            return model
        from torch.nn.parallel import DistributedDataParallel as DDP

        ids = [device.index] if device.type == "cuda" else None
        return DDP(model, device_ids=ids)

    def any(self, flag: bool) -> bool:
        if self.world == 1:
            return flag
        t = torch.tensor([1.0 if flag else 0.0])
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return bool(t.item() > 0)

    def sum(self, value: float) -> float:
        if self.world == 1:
            return value
        t = torch.tensor([value], dtype=torch.float64)
        dist.all_reduce(t)
        return float(t.item())

    def gather_ids(self, ids: list[int]) -> list[int]:
        if self.world == 1:
            return ids
        out: list[list[int] | None] = [None] * self.world
        dist.all_gather_object(out, ids)
        return [i for part in out for i in (part or [])]

    def barrier(self) -> None:
        if self.world > 1:
            dist.barrier()
