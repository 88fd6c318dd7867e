"""The run's samples, fed to ``train_step``: this rank's micro-batches from the run's position, their
loss weights, and the device copies of each micro-batch with its sample ids and data wait.  Out of
run/loop.py, which drives when; the position and micro-batch are the loop's :class:`RunState`
(they move with a step, an OOM split and a resume), so each call reads them from it.

Exactness: the order is a function of (seed, epoch); the position is the number of samples
consumed; each micro-batch's loss is weighted by its share of the effective batch's label tokens
(data/loader.py ``step_weights``), so any split of a step computes the same gradients.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import torch

from trainfit.data.dataset import TokenData
from trainfit.data.loader import (
    LoaderKnobs,
    SampleOrder,
    make_loader,
    micro_batch_ids,
    step_weights,
)
from trainfit.engine.dist import Dist
from trainfit.job import JobSpec
from trainfit.memory.limit import LimitTracker
from trainfit.run.checkpoint import RunState
from trainfit.run.oom import InjectedOOM


class Feed:
    """This rank's share of the run's samples, in the order (seed, epoch) makes."""

    def __init__(self, data: TokenData, task: str, job: JobSpec, dist: Dist,
                 device: torch.device) -> None:
        self.data, self.task, self.job, self.dist, self.device = data, task, job, dist, device
        self.order = SampleOrder(len(data), seed=job.seed)

    def _schedule(self, state: RunState) -> Iterator[list[int]]:
        """Micro-batches of this rank from the state's position on (a DataLoader batch sampler;
        an OOM split makes a new one at the split's micro-batch)."""
        pos, eff = state.position, self.job.effective_batch
        while True:
            yield from micro_batch_ids(self.order, pos, eff, state.micro_batch, self.dist.rank,
                                       self.dist.world)
            pos += eff

    def loader(self, state: RunState) -> Iterator[dict[str, torch.Tensor]]:
        """A fresh iterator over the micro-batches from ``state`` on."""
        knobs = LoaderKnobs.from_job(self.job)
        loader = make_loader(self.data, self.task, _Sched(lambda: self._schedule(state)), knobs,
                             pin=self.device.type == "cuda", packed=self.job.padding_free)
        # iter(DataLoader) draws its base seed from torch's global generator: a resume (and an
        # OOM split) makes a loader where the uninterrupted run did not, which shifted every
        # dropout mask after it (an audit: LoRA dropout 0.1, losses off by up to 1e-3 after a
        # resume); the order comes from the schedule, so the draw is put back
        rng = torch.get_rng_state()
        try:
            return iter(loader)
        finally:
            torch.set_rng_state(rng)

    def weights(self, state: RunState) -> list[float]:
        """The loss weight of each of this rank's micro-batches in the step at ``state``."""
        return step_weights(self.data, self.order, state.position, self.job.effective_batch,
                            state.micro_batch, self.task, self.dist.rank, self.dist.world)

    def batches(self, it: Iterator[dict[str, torch.Tensor]], n_micro: int, step: int,
                ids_done: list[int], waits: list[float], injected: set[int],
                tracker: LimitTracker | None) -> Iterator[dict[str, Any]]:
        """The step's micro-batches on the device; records their sample ids and data wait.
        ``injected``: steps whose last micro-batch raises a fake OOM (fault injection, once)."""
        for k in range(n_micro):
            t = time.perf_counter()
            b = next(it)
            ids_done.extend(b.pop("sample_ids").tolist())
            b = {key: v.to(self.device, non_blocking=True) for key, v in b.items()}
            waits.append(time.perf_counter() - t)
            if step in injected and k == n_micro - 1:
                injected.discard(step)
                raise InjectedOOM("injected OOM (fault injection)")
            if tracker is not None:
                for v in b.values():
                    tracker.track(v, "buffers")
            yield b


class _Sched:
    """Re-iterable wrapper so DataLoader can take a generator factory as its batch sampler."""

    def __init__(self, factory: Any) -> None:
        self.factory = factory

    def __iter__(self) -> Iterator[list[int]]:
        return self.factory()
