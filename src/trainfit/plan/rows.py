"""Which rows of a plan are ranked against which, and which are worth showing.

Rows are ranked by predicted tokens/s only against rows of the same effective batch: without
``--effective-batch`` each micro-batch is its own effective batch (accumulation 1), and a faster
step at a larger optimizer batch is not a better configuration of the same training.

Shown: in each (precision, checkpointing) group, the rows around the fitting frontier (the largest
micro-batch that fits) — the fitting rows (with a fixed effective batch all of them, they are the
memory/speed trade-off of one training; otherwise the frontier alone: smaller micro-batches are
other, smaller effective batches) and at most two above it that do not fit (how far the next step
is). The pick, the ▲ rows and every row of a
plan without a GPU (no frontier) are always shown; the rest stays in ``--json``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

ABOVE_FRONTIER = 2
"""Rows that do not fit shown above each group's frontier."""
BELOW_FRONTIER_VARYING = 0
"""Fitting rows shown below the frontier when the effective batch varies between rows."""


def take_exact_row(rows: list[Any], exact: Any) -> list[Any]:
    """The grid's row of ``exact``'s configuration (precision, checkpointing, micro-batch,
    accumulation) takes its full-size simulation, so that the table and the line 'against what
    you run now' give one number for one configuration (the extrapolated row had said 6.24 GiB
    beside the simulated 6.22); ▲ stays only where the simulation fits: the rows it left, for
    the grid to mark the candidate below."""
    # every field that shapes the step: a script's current configuration may differ from the
    # grid's in more than the four knobs (a --method or --optimizer given over the script), and
    # its simulation must then not stand for a grid row
    dropped = []
    for i, r in enumerate(rows):
        if r.how != "simulated" and _same_step(r, exact):
            rows[i] = dataclasses.replace(r, memory=exact.memory, how=exact.how,
                                          speed=exact.speed, largest_fitting=r.largest_fitting
                                          and exact.memory.fits is True)
            if r.largest_fitting and not rows[i].largest_fitting:
                dropped.append(rows[i])
    return dropped


_STEP_KEY = ("precision", "grad_ckpt", "micro_batch", "grad_accum", "method", "lora_r",
             "lora_alpha", "lora_targets", "lora_dropout", "quant", "base_dtype", "optimizer",
             "optimizer_impl", "attention", "ranks", "sharding", "seq_len", "trl_logprob_head",
             "compile", "compile_builds_mask", "padding_free", "padded")


def _same_step(row: Any, exact: Any) -> bool:
    """Every field of the two jobs equal but how the effective batch is written (a grid row
    keeps it, a current run may derive it): a field outside :data:`_STEP_KEY` that shapes the
    step (activation offload, clipping, a chunked head, ...) counts too (a review: a current
    run with activation offload took a grid row's place)."""
    return _same_split(row.job, exact.job) and fields_but_split(row.job) == \
        fields_but_split(exact.job)


_SPLIT = ("micro_batch", "grad_accum", "effective_batch")


def fields_but_split(job: Any) -> dict[str, Any]:
    return {k: v for k, v in job.to_dict().items() if k not in _SPLIT}


def _same_split(a: Any, b: Any) -> bool:
    return (a.micro_batch, a.grad_accum or 1) == (b.micro_batch, b.grad_accum or 1)


def _effective(job: Any) -> int:
    return (job.micro_batch or 1) * (job.grad_accum or 1) * job.ranks


def _same_group(row: Any, exact: Any) -> bool:
    """The same job but for the split of one effective batch into micro-batches."""
    return _effective(row.job) == _effective(exact.job) and fields_but_split(row.job) == \
        fields_but_split(exact.job)


def add_current_row(rows: list[Any], current: Any) -> None:
    """The user's current configuration joins its group's rows when no row is its step: a
    micro-batch that divides the effective batch but is no power of two (3 of 12) is predicted
    by the grid and not shown (a review: ``--current`` at micro-batch 3 × 4 was predicted faster
    than the pick, 4 × 3, which was called the fastest that fits, and the table had no row of
    it).  A configuration that differs in more than the split (a script's, with a --method or
    --optimizer given over it) is no row of the grid: compared against, not ranked."""
    if any(_same_step(r, current) for r in rows):
        return
    group = [i for i, r in enumerate(rows) if _same_group(r, current)]
    if not group:
        return
    micro = current.job.micro_batch or 0
    at = next((i for i in group if (rows[i].job.micro_batch or 0) > micro), group[-1] + 1)
    rows.insert(at, dataclasses.replace(current, largest_fitting=False, recommended=False,
                                        rank=None, shown=True))


def mark_largest_fitting(rows: list[Any]) -> None:
    """▲ on the largest micro-batch of each group that fits, once full-size simulations have
    replaced extrapolated rows or joined them (the current configuration's row,
    :func:`add_current_row`): it moves up to a simulated row that fits where its extrapolation
    did not, and off one that does not fit. Where a simulation took it off, the grid first made
    the candidate below a row (``_Grid.mark_below``), so that the largest row that fits is the
    largest micro-batch predicted to fit, not the largest power of two."""
    groups: dict[str, list[Any]] = {}
    for r in rows:
        groups.setdefault(repr(sorted(fields_but_split(r.job).items())), []).append(r)
    for group in groups.values():
        fitting = [r for r in group if r.memory.fits is True]
        top = max(fitting, key=lambda r: r.job.micro_batch or 0) if fitting else None
        for r in group:
            r.largest_fitting = r is top


def show_current(rows: list[Any], current: Any) -> None:
    """The grid's row of the user's current configuration is shown, whatever its distance from
    the fitting frontier: the line 'against what you run now' compares with it (an audit: a
    --current row 68 GiB over the card was compared against, not in the table)."""
    for r in rows:
        if _same_step(r, current):
            r.shown = True


def rank_rows(rows: list[Any], sort_key: Callable[[Any], Any]) -> None:
    """Set ``row.rank`` (1 = fastest that fits) among the rows of the same effective batch."""
    by_batch: dict[int | None, list[int]] = {}
    for i, r in enumerate(rows):
        if r.memory.fits is not False:
            by_batch.setdefault(r.job.effective_batch, []).append(i)
    for idx in by_batch.values():
        for n, i in enumerate(sorted(idx, key=lambda i: sort_key(rows[i])), 1):
            rows[i].rank = n


def effective_batches(rows: list[Any]) -> list[int]:
    """The distinct effective batches of the rows, ascending."""
    return sorted({r.job.effective_batch for r in rows if r.job.effective_batch is not None})


def _group_shown(group: list[int], rows: list[Any], varying: bool) -> set[int]:
    fitting = [i for i in group if rows[i].memory.fits]
    above = [i for i in group if rows[i].memory.fits is False
             and (not fitting or rows[i].job.micro_batch > rows[fitting[-1]].job.micro_batch)]
    keep = fitting[-(BELOW_FRONTIER_VARYING + 1):] if varying else fitting
    return {*keep, *above[:ABOVE_FRONTIER]}


def mark_shown(rows: list[Any]) -> None:
    """Set ``row.shown`` on the rows worth a line of the table (see the module docstring)."""
    if any(r.memory.fits is None for r in rows):
        for r in rows:
            r.shown = True
        return
    varying = len(effective_batches(rows)) > 1
    groups: dict[tuple[str | None, str | None], list[int]] = {}
    for i, r in enumerate(rows):
        groups.setdefault((r.job.precision, r.job.grad_ckpt), []).append(i)
    shown: set[int] = set()
    for idx in groups.values():
        idx.sort(key=lambda i: rows[i].job.micro_batch or 0)
        shown |= _group_shown(idx, rows, varying)
    for i, r in enumerate(rows):
        r.shown = i in shown or r.recommended or r.largest_fitting


@dataclasses.dataclass(frozen=True)
class PrecisionInversion:
    """The smallest configuration at which bf16-true's predicted allocated peak exceeds
    amp-bf16's at the same knobs (everything else equal): its 2-byte weights and optimizer states
    are outgrown by what its step saves for the backward."""

    grad_ckpt: str | None
    micro_batch: int
    grad_accum: int | None
    bf16_true_bytes: int
    amp_bf16_bytes: int
    every_larger: bool = False
    """Every larger micro-batch of the same knobs planned under both inverts too (and there is
    one): the note then says "from" it, else "at" it."""


def precision_inversion(rows: list[Any]) -> PrecisionInversion | None:
    """Where bf16-true needs more than amp-bf16 (an audit: on a Mamba-2 hybrid, bf16-true at
    micro-batch 16 allocated 154.85 GiB against amp-bf16's 131.96, with no word why) — None
    where it never does."""
    amp = {_knobs(r): r for r in rows if r.job.precision == "amp-bf16"}
    found = [(r, amp[_knobs(r)]) for r in rows if r.job.precision == "bf16-true"
             and _knobs(r) in amp
             and r.memory.peak_allocated_bytes > amp[_knobs(r)].memory.peak_allocated_bytes]
    if not found:
        return None
    r, a = min(found, key=lambda p: (p[0].job.micro_batch or 0, str(p[0].job.grad_ckpt)))
    inverted = {id(x) for x, _ in found}
    larger = [x for x in rows if x.job.precision == "bf16-true" and _knobs(x) in amp
              and x.job.grad_ckpt == r.job.grad_ckpt
              and (x.job.micro_batch or 0) > (r.job.micro_batch or 0)]
    return PrecisionInversion(grad_ckpt=r.job.grad_ckpt, micro_batch=r.job.micro_batch,
                              grad_accum=r.job.grad_accum,
                              bf16_true_bytes=r.memory.peak_allocated_bytes,
                              amp_bf16_bytes=a.memory.peak_allocated_bytes,
                              every_larger=bool(larger)
                              and all(id(x) in inverted for x in larger))


def _knobs(row: Any) -> tuple[Any, ...]:
    """Every field that shapes the step but the precision."""
    values = (getattr(row.job, k) for k in _STEP_KEY if k != "precision")
    return tuple(tuple(v) if isinstance(v, list) else v for v in values)  # lora_targets
