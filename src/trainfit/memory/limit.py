"""A capacity for the CPU stand-in of a GPU: live tensor bytes over a limit raise the GPU's error
(``tune --memory-limit``, ``train --memory-limit``)."""

from __future__ import annotations

from typing import Any

import torch

from trainfit.memory.tracker import LiveBytesTracker


class LimitTracker(LiveBytesTracker):
    """Live tensor bytes with a capacity: crossing it raises ``torch.OutOfMemoryError`` (CPU stand-in
    for a GPU of that size)."""

    def __init__(self, limit_bytes: int | None) -> None:
        super().__init__(block_bytes=1)
        self.limit_bytes = limit_bytes

    def _check_peak(self, state: Any = None) -> None:
        # the limit before the peak: the allocation it refuses never existed (an audit: the
        # logged peak passed --memory-limit by the refused tensor)
        if state is None:
            self._settle()
        cur = self.current_bytes if state is None else state.cur
        if self.limit_bytes is not None and cur > self.limit_bytes:
            raise torch.OutOfMemoryError(
                # worded like the GPU's message (" out of memory."): tools that match it
                # (accelerate, Lightning) take the same path they would on a GPU
                f"trainfit --memory-limit (CPU stand-in for a GPU) out of memory. Tried to hold "
                f"{cur / 2**30:.3f} GiB of "
                f"tensors, limit {self.limit_bytes / 2**30:.3f} GiB (phase {self.phase})")
        super()._check_peak(state)

    def reset_peak(self) -> None:
        """Start the peak again from what is alive now (``torch.cuda.reset_peak_memory_stats``'s
        twin): after an OOM split the failed attempt's peak is not the run's."""
        self.peak = type(self.peak)()
        self.phase_peaks.clear()
        self.phase_breakdowns.clear()
        self._phase_peak_uid.clear()  # reclassify() looks its phase keys up there
        self._check_peak()

    def track_model(self, model: torch.nn.Module,
                    optimizer: torch.optim.Optimizer | None = None) -> list[torch.Tensor]:
        """Book what exists before a step — the model's weights and buffers (``parameters``) and
        any optimizer state already made (``optimizer``: a resumed or stepped run holds it) — and
        return them. One setup for doctor's, train's and tune's trackers, so the three measure a
        limit in the same bytes. Raises ``torch.OutOfMemoryError`` when they alone cross it."""
        weights = [*model.parameters(), *model.buffers()]
        states = state_tensors(optimizer)
        for t in weights:
            self.track(t, "parameters")  # a tied or shared weight's storage is booked once
        for t in states:
            self.track(t, "optimizer")
        return [*weights, *states]


def state_tensors(optimizer: torch.optim.Optimizer | None) -> list[torch.Tensor]:
    """The optimizer's states that exist (none before its first step; AdamW's ``step`` counts
    are tensors too)."""
    if optimizer is None:
        return []
    return [v for st in optimizer.state.values() for v in st.values()
            if isinstance(v, torch.Tensor)]
