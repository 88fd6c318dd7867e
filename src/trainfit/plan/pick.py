"""Which row of a plan is the pick: the fastest predicted configuration that fits, kept at the
user's precision (and fp32 weights) where another gains no more than the predictions err by, and
what changes from the current configuration to it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from trainfit.job import JobSpec
from trainfit.plan.result import COMPARED_FIELDS, FieldChange, PlanRow

_PRECISION_PREF = {"amp-bf16": 0, "amp-fp16": 1, "bf16-true": 2, "fp32": 3}


def sort_key(row: PlanRow) -> tuple[Any, ...]:
    """Fastest predicted first; without a speed (unknown peak) prefer no recomputation, larger
    micro-batches, mixed precision."""
    tps = row.speed.tokens_per_s if row.speed is not None else None
    return (tps is None, -(tps or 0.0), row.job.grad_ckpt != "off", -(row.job.micro_batch or 1),
            _PRECISION_PREF.get(row.job.precision or "", 9))


def recommend(rows: list[PlanRow], keep_band: float | None = None,
              current_precision: str | None = None) -> int | None:
    """The fastest fitting row; with a current configuration (``keep_band``: the speed band's
    median error), one that keeps fp32 weights where pure bf16 gains no more than the band, and
    one at the current precision where another precision gains no more than the band (an
    audit: a bf16-based LoRA script was told dtype=float32, bf16=False for a predicted +11.8 %,
    inside the 14 % the predictions err by, doubling its frozen weights' memory)."""
    fitting = [i for i, r in enumerate(rows) if r.memory.fits is not False]
    if not fitting:
        return None
    best = min(fitting, key=lambda i: sort_key(rows[i]))
    if keep_band is None:
        return best
    # each measured against the fastest row itself, never against another kept row (a review:
    # chained, the pick fell (1 + band)² − 1 behind it and was said "inside the band")
    b = rows[best].job
    if current_precision is not None and b.precision != current_precision:
        same = _fastest_keeping(rows, fitting, best, lambda j: j.precision == current_precision)
        if same is not None and _gain(rows[best], rows[same]) <= keep_band:
            return same
    if current_precision != "bf16-true" and b.precision == "bf16-true":
        alt = _fastest_keeping(rows, fitting, best, lambda j: j.precision != "bf16-true")
        if alt is not None and _gain(rows[best], rows[alt]) <= keep_band:
            return alt
    return best


def _fastest_keeping(rows: list[PlanRow], fitting: list[int], best: int,
                     keeps: Callable[[JobSpec], bool]) -> int | None:
    """The fastest fitting row whose job ``keeps`` what the current configuration has (its
    precision, or fp32 weights), at the fastest row's effective batch and ranks, both speeds
    known (None otherwise)."""
    b = rows[best]
    if b.speed is None or not b.speed.tokens_per_s:
        return None
    keep = [i for i in fitting if keeps(rows[i].job)
            and rows[i].job.effective_batch == b.job.effective_batch
            and rows[i].job.ranks == b.job.ranks
            and rows[i].speed is not None and rows[i].speed.tokens_per_s]  # type: ignore[union-attr]
    return min(keep, key=lambda i: sort_key(rows[i])) if keep else None


def _gain(pick: PlanRow, other: PlanRow) -> float:
    """``pick``'s predicted tokens/s over ``other``'s, less 1 (both known)."""
    return pick.speed.tokens_per_s / other.speed.tokens_per_s - 1  # type: ignore[union-attr,operator]


def keep_fp32_weights(rows: list[PlanRow], rec: int | None, keep_band: float
                      ) -> dict[str, Any] | None:
    """The faster row of another precision the pick passed over (:func:`recommend`): bf16-true
    where the current configuration keeps fp32 weights, or any precision but the current one,
    its predicted gain inside the median error of speed predictions of this kind (the speed
    band): pure bf16 loses updates below its resolution and changes how the model learns, and
    another precision changes the numerics and the weights' memory, which a gain the
    predictions cannot resolve does not pay for (an audit: a script's amp-bf16 was told to drop
    fp32 weights for +0.9 %, predicted)."""
    if rec is None:
        return None
    fitting = [i for i, r in enumerate(rows) if r.memory.fits is not False]
    best = min(fitting, key=lambda i: sort_key(rows[i]))
    if best == rec or rows[best].job.precision == rows[rec].job.precision or \
            rows[best].speed is None or not rows[best].speed.tokens_per_s or \
            rows[rec].speed is None or not rows[rec].speed.tokens_per_s or \
            _gain(rows[best], rows[rec]) > keep_band:
        return None
    return {"precision": rows[best].job.precision,
            "tokens_per_s": rows[best].speed.tokens_per_s,  # type: ignore[union-attr]
            "gain": _gain(rows[best], rows[rec]), "median_abs_error": keep_band}


def versus(cur: PlanRow | None, pick: PlanRow | None) -> dict[str, Any]:
    """The pick against the current configuration: the fields that change and the speed-up."""
    if cur is None or pick is None:
        return {}
    changes = [FieldChange(k, getattr(cur.job, k), getattr(pick.job, k)) for k in COMPARED_FIELDS
               if getattr(cur.job, k) != getattr(pick.job, k)]
    ct = cur.speed.tokens_per_s if cur.speed else None
    pt = pick.speed.tokens_per_s if pick.speed else None
    return {"changes_vs_current": changes, "speedup_vs_current": pt / ct if ct and pt else None}
