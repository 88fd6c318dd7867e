"""Which micro-batches and precisions a job's step can take (tune's and doctor's search space)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from trainfit.job.spec import JobSpec


def dividing_micro_batches(per_rank_batch: int, upto: int | None = None) -> list[int]:
    """The micro-batches (≤ ``upto``, default the per-rank batch) that divide the per-rank effective
    batch: with them gradient accumulation keeps the effective batch exact."""
    top = per_rank_batch if upto is None else min(upto, per_rank_batch)
    return [m for m in range(1, top + 1) if per_rank_batch % m == 0]


def step_micro_batches(job: JobSpec, per_rank_batch: int, upto: int | None = None) -> list[int]:
    """The micro-batches ``job``'s step can take for this per-rank batch: those dividing it
    (:func:`dividing_micro_batches`), and with ``optimizer_in_backward`` only the whole batch (it
    cannot accumulate)."""
    ok = dividing_micro_batches(per_rank_batch, upto)
    return [m for m in ok if m == per_rank_batch] if job.optimizer_in_backward else ok


def step_precisions(job: JobSpec, precisions: Iterable[str]) -> list[str]:
    """The ``precisions`` ``job``'s step can run: amp-fp16's GradScaler checks the whole step's
    gradients, which ``optimizer_in_backward`` never holds at once."""
    return [p for p in precisions if not (job.optimizer_in_backward and p == "amp-fp16")]
