"""A capacity for the CPU stand-in of a GPU: live tensor bytes over a limit raise the GPU's error
(``tune --memory-limit``, ``train --memory-limit``)."""

from __future__ import annotations

import torch

from trainfit.memory.tracker import LiveBytesTracker


class LimitTracker(LiveBytesTracker):
    """Live tensor bytes with a capacity: crossing it raises ``torch.OutOfMemoryError`` (CPU stand-in
    for a GPU of that size)."""

    def __init__(self, limit_bytes: int | None) -> None:
        super().__init__(block_bytes=1)
        self.limit_bytes = limit_bytes

    def _check_peak(self) -> None:
        super()._check_peak()
        if self.limit_bytes is not None and self.current_bytes > self.limit_bytes:
            raise torch.OutOfMemoryError(
                # worded like the GPU's message (" out of memory."): tools that match it
                # (accelerate, Lightning) take the same path they would on a GPU
                f"trainfit --memory-limit (CPU stand-in for a GPU) out of memory. Tried to hold "
                f"{self.current_bytes / 2**30:.3f} GiB of "
                f"tensors, limit {self.limit_bytes / 2**30:.3f} GiB (phase {self.phase})")
