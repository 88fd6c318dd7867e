"""TensorBoard scalars of the monitor's rows (optional: only when ``tensorboard`` is installed).

The sampler (:mod:`trainfit.monitor.sampler`) hands each sample's rows here after writing them to
its log; this module only maps the ``monitor.jsonl`` columns onto ``SummaryWriter.add_scalar``.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

from trainfit.monitor.sampler import GPU_COLUMNS, HOST_COLUMNS, STEP_COLUMNS


class TensorboardScalars:
    """One run's TensorBoard writer: train/*, host/*, eval/* and gpuN/* scalars."""

    def __init__(self, writer: Any) -> None:
        self._tb = writer
        self._tb_step: int | None = None  # the last step whose metrics TensorBoard has

    @classmethod
    def open(cls, log_dir: Path, notes: list[str]) -> TensorboardScalars | None:
        """The writer, or None (and a note) when tensorboard is not installed."""
        if importlib.util.find_spec("tensorboard") is None:
            notes.append("tensorboard not installed: no TensorBoard scalars (pip install tensorboard)")
            return None
        from torch.utils.tensorboard import SummaryWriter

        return cls(SummaryWriter(log_dir=str(log_dir)))

    def write(self, rows: list[dict[str, Any]], *, start_step: int | None, samples: int) -> None:
        first = rows[0]
        # before a run's first step: the step it starts from (a resumed segment's host readings
        # landed at steps 0, 1, 2 … over the earlier segment's: an audit); a bare monitor has no
        # steps: its sample count
        global_step = first["step"] if first["step"] is not None else \
            start_step if start_step is not None else samples
        # a step's metrics once: a sample taken while no step ended (a checkpoint being saved,
        # an evaluation) carries the last step's row, which TensorBoard drew again at the same
        # step (an audit: train/loss 5 times at step 4); the host's and GPUs' readings each time
        new_step = first["step"] is not None and first["step"] != self._tb_step
        self._tb_step = first["step"] if first["step"] is not None else self._tb_step
        for col in (*(STEP_COLUMNS[1:] if new_step else ()), *HOST_COLUMNS):
            if first[col] is not None:
                self._tb.add_scalar(f"{'host' if col in HOST_COLUMNS else 'train'}/{col}", first[col],
                                    global_step)
        if first.get("eval_step") is not None:
            for col in ("eval_loss", "eval_perplexity"):
                if isinstance(first.get(col), float) and first[col] == first[col]:  # not NaN
                    self._tb.add_scalar(f"eval/{col}", first[col], first["eval_step"])
        for r in rows:
            if r["gpu_index"] is None:
                continue
            for col in GPU_COLUMNS[1:]:
                if r[col] is not None:
                    self._tb.add_scalar(f"gpu{r['gpu_index']}/{col}", r[col], global_step)

    def close(self) -> None:
        self._tb.close()
