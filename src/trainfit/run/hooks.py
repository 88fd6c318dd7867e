"""Library use, for people who keep their own loop: the monitoring and OOM handling of
``trainfit train`` as an HF ``TrainerCallback`` and as a context manager / step hook.

    from trainfit import TrainfitCallback, watch
    trainer = Trainer(..., callbacks=[TrainfitCallback(log_path="monitor.jsonl")])

    with watch("monitor.jsonl") as hook:
        for batch in loader:
            with hook.data_wait():        # optional: time spent waiting for data
                batch = next(it)
            loss = hook.split_on_oom(step_fn, batch)   # halves the micro-batch on OOM
            hook.step(loss=loss, tokens=batch["input_ids"].numel())
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from trainfit.monitor import Sampler
from trainfit.run.oom import free_after_oom, row_chunks


class StepHook:
    """Feeds a :class:`Sampler` from a plain loop; times steps between ``step()`` calls."""

    def __init__(self, sampler: Sampler) -> None:
        self.sampler = sampler
        self.n = 0
        self._t = time.perf_counter()
        self._wait_s = 0.0
        self.oom_splits = 0

    @contextlib.contextmanager
    def data_wait(self) -> Iterator[None]:
        t = time.perf_counter()
        try:
            yield
        finally:
            self._wait_s += time.perf_counter() - t

    def step(self, *, loss: float | torch.Tensor | None = None, tokens: int | None = None,
             samples: int | None = None) -> None:
        now = time.perf_counter()
        if isinstance(loss, torch.Tensor):
            loss = float(loss.detach())  # one sync per optimizer step, not per micro-step
        self.n += 1
        peak = torch.cuda.max_memory_allocated() if torch.cuda.is_available() else None
        self.sampler.record_step(step=self.n, loss=loss, tokens=tokens, samples=samples,
                                 step_time_s=now - self._t, data_wait_s=self._wait_s,
                                 peak_allocated_bytes=peak)
        self._t, self._wait_s = now, 0.0

    def split_on_oom(self, step_fn: Callable[[dict[str, torch.Tensor], float], Any],
                     batch: dict[str, torch.Tensor]) -> float:
        """Run ``step_fn(chunk, weight)`` (forward + backward of a chunk, its loss multiplied by
        ``weight``) on the whole batch; on OOM, free and redo the same samples in halves. Returns
        the summed loss. The caller steps the optimizer afterwards."""
        size = next(iter(batch.values())).shape[0]
        parts = 1
        while True:
            try:
                total = 0.0
                for piece, rows in row_chunks(batch, parts):
                    out = step_fn(piece, rows / size)
                    total += float(out) if out is not None else 0.0
                return total
            except torch.OutOfMemoryError:
                if parts >= size:
                    raise
                parts *= 2
                self.oom_splits += 1
                free_after_oom()


@contextlib.contextmanager
def watch(log_path: str | Path | None = "monitor.jsonl", *, interval_s: float = 1.0,
          live: bool | None = None) -> Iterator[StepHook]:
    """Sample GPUs/host in a thread while the block runs; the hook takes the loop's step metrics."""
    with Sampler(interval_s=interval_s, log_path=log_path, live=live) as sampler:
        yield StepHook(sampler)


def _trainer_callback_base() -> type:
    from transformers import TrainerCallback

    return TrainerCallback


class TrainfitCallback(_trainer_callback_base()):  # type: ignore[misc]
    """HF Trainer callback: the monitor thread and step metrics (loss, tokens/s, peak memory).

    Under several processes only the world's main process samples and writes the log: each
    rank's sampler opened the same file for writing, truncated and interleaved it, and counted
    every step once per rank (a review: report refused the torn log). A step's metrics wait for
    the trainer's log of that step: transformers calls ``on_step_end`` before ``on_log``, so the
    loss read in ``on_step_end`` was the previous logging window's (the loss logged at step N
    is the trainer's mean over its ``logging_steps`` window ending at N)."""

    def __init__(self, log_path: str | Path | None = "monitor.jsonl", interval_s: float = 1.0,
                 live: bool | None = False, seq_len: int | None = None) -> None:
        self.sampler = Sampler(interval_s=interval_s, log_path=log_path, live=live)
        self.seq_len = seq_len
        self._t = 0.0
        self._active = False
        self._pending: dict[str, Any] | None = None

    def on_train_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        self._active = bool(getattr(state, "is_world_process_zero", True))
        if self._active:
            self.sampler.start()

    def on_step_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        self._flush()
        self._t = time.perf_counter()

    def on_log(self, args: Any, state: Any, control: Any, logs: dict | None = None, **kw: Any) -> None:
        if self._pending is not None and logs and "loss" in logs \
                and self._pending["step"] == state.global_step:
            self._pending["loss"] = float(logs["loss"])
            self._flush()

    def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        if not self._active:
            return
        self._flush()
        samples = args.per_device_train_batch_size * args.gradient_accumulation_steps * \
            max(args.world_size, 1)
        peak = torch.cuda.max_memory_allocated() if torch.cuda.is_available() else None
        self._pending = dict(step=state.global_step, loss=None, samples=samples,
                             tokens=samples * self.seq_len if self.seq_len else None,
                             step_time_s=time.perf_counter() - self._t, peak_allocated_bytes=peak)

    def _flush(self) -> None:
        """The held step's metrics into the sampler (with its loss when the trainer logged one)."""
        if self._pending is not None:
            self.sampler.record_step(**self._pending)
            self._pending = None

    def on_train_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        if self._active:
            self._flush()
            self.sampler.stop()
