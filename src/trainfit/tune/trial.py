"""What tune's search works with: a probe's predicted and measured numbers (:class:`Trial`), the
search's options and outcome, and the micro-batches a job allows. Pure Python: no torch (as
``search``), so the search is tested with fake probes."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from trainfit.job import DEFAULT_MARGIN, JobSpec, step_micro_batches
from trainfit.job.fields import DEFAULT_KNOBS
from trainfit.speed.compare import NOISE_FLOOR, ROUNDS
from trainfit.tune.result import ProbeResult, SearchNote


@dataclass(kw_only=True)
class Predicted:
    peak_allocated_bytes: int | None = None
    peak_reserved_bytes: int | None = None
    peak_device_bytes: int | None = None
    step_time_s: float | None = None
    tokens_per_s: float | None = None
    from_busy_timings: bool = False
    """The speed rests on kernel times measured while other processes used this CPU (twice:
    :class:`trainfit.speed.cpu_kernels.KernelTimer`): too slow by an unknown factor, so no
    candidate is pruned on it."""


@dataclass(kw_only=True)
class Trial:
    index: int
    stage: str
    """batch (memory bisection) | speed (micro-batch by speed) | knobs | confirm"""
    job: JobSpec
    result: ProbeResult
    predicted: Predicted | None
    fits: bool
    note: str = ""
    timed_steps: int = 0
    """Timed steps after the probe's metered one (0: a memory probe)."""


@dataclass(kw_only=True)
class SearchOptions:
    margin: float = DEFAULT_MARGIN
    """Fraction of the capacity kept free: a probe fits when its peak ≤ (1 − margin) × capacity."""
    budget_s: float | None = None
    """Stop probing after this many seconds (the best so far is kept)."""
    knobs: tuple[str, ...] = DEFAULT_KNOBS
    precisions: tuple[str, ...] = ("fp32",)
    """Precisions the device supports (tried unless the job fixed one)."""
    fixed: frozenset[str] = frozenset()
    """Knobs the user set explicitly: not searched (said in a note)."""
    unsupported: frozenset[str] = frozenset()
    """Knobs the model cannot take (a module without checkpointing): not searched, said so."""
    worker_counts: tuple[int, ...] = (0, 1, 2)
    cuda: bool = False
    """The device is a GPU: pinned host memory can speed up its copies (tried as a knob)."""
    bitsandbytes: bool = False
    """bitsandbytes is importable (the ``optimizer_8bit`` knob needs it)."""
    noise_floor: float = NOISE_FLOOR
    """Smallest relative speed gain ever called real."""
    run_steps: int | None = None
    """Planned optimizer steps of the real run (amortises compile time)."""
    rounds: int = ROUNDS
    """Interleaved rounds (A B, then B A, …) a gain must survive: every round must show it, and no
    repeat of the candidate may be slower than a repeat of the incumbent.  The probes that
    proposed the candidate are not one of them (measured minutes apart, not back to back)."""
    prune_below: float = 0.6
    """Skip a candidate whose predicted tokens/s is below this fraction of the current best's
    prediction (the speed model's median error on this CPU is ~25 %: 0.6 leaves room for it)."""


@dataclass
class Outcome:
    best: Trial | None
    trials: list[Trial] = field(default_factory=list)
    notes: list[SearchNote] = field(default_factory=list)
    largest_fitting_micro: int | None = None
    excluded_micro: list[int] = field(default_factory=list)
    search_time_s: float = 0.0
    stopped_by_budget: bool = False


def rel_spread(t: Trial) -> float:
    """max − min of a probe's timed steps over their median (its own noise)."""
    m = t.result.measured
    return (m.step_time_spread_s / m.step_time_s) if m and m.step_time_s and \
        m.step_time_spread_s is not None else 0.0


def micro_options(job: JobSpec, dataset_samples: int) -> tuple[list[int], list[int]]:
    """(micro-batches that divide the per-rank effective batch — gradient accumulation then exact —,
    those excluded because they do not divide it); capped by the per-rank batch and the dataset."""
    per_rank = (job.effective_batch or 1) // job.ranks
    cap = min(per_rank, max(dataset_samples // job.ranks, 1))
    ok = step_micro_batches(job, per_rank, cap)
    return ok, [m for m in range(1, cap + 1) if m not in ok]


def peak_of(r: ProbeResult) -> int | None:
    m = r.measured
    if m is None:
        return None
    return m.peak_reserved_bytes if m.peak_reserved_bytes is not None else m.peak_allocated_bytes


def changed_fields(a: JobSpec, b: JobSpec) -> list[tuple[str, Any]]:
    """The fields in which ``a`` differs from ``b``, with ``a``'s values."""
    keys = ("micro_batch", "precision", "grad_ckpt", "attention", "optimizer", "optimizer_impl",
            "num_workers", "prefetch_factor", "pin_memory", "compile")
    return [(k, getattr(a, k)) for k in keys if getattr(a, k) != getattr(b, k)]
