"""The invariants every plan row must keep (tests/plan/test_invariants.py sweeps them over tiny
models; benchmarks/invariants.py over the plans users reported, at catalog scale): the counts
of what was checked and of each violation, and one function per invariant."""

from __future__ import annotations

import dataclasses
import itertools
from collections import Counter
from typing import Any

from trainfit.job import JobSpec
from trainfit.memory.bilinear import SEGMENT_SLACK_BYTES, BilinearModel
from trainfit.plan.result import PlanRow

EXTRAPOLATION_TOLERANCE = 0.01
"""Extrapolated allocated peak vs the full-size simulation: the fit points are micro-batches 2
and 3 (at micro-batch 1 a few copies are skipped, extrapolate.FIT_BATCHES), so micro-batch 1
may be over-predicted by those copies; everywhere else the phase peaks are bilinear."""


@dataclasses.dataclass
class Checked:
    """Counts of configurations checked and violations by invariant, with examples."""

    configurations: int = 0
    violations: Counter = dataclasses.field(default_factory=Counter)
    examples: dict[str, list[str]] = dataclasses.field(default_factory=dict)
    skipped: list[str] = dataclasses.field(default_factory=list)
    max_fragmentation_ratio: float = 0.0

    def check(self, name: str, ok: bool, what: str) -> None:
        if not ok:
            self.violations[name] += 1
            self.examples.setdefault(name, [])
            if len(self.examples[name]) < 5:
                self.examples[name].append(what)


def _desc(r: PlanRow) -> str:
    j = r.job
    return (f"{j.model} {j.method} {j.precision} ckpt={j.grad_ckpt} {j.micro_batch}x"
            f"{j.grad_accum} ranks={j.ranks}/{j.sharding} [{r.how}]")


def check_terms(c: Checked, r: PlanRow) -> None:
    """Every breakdown term ≥ 0, and the terms other than ``managed`` (paged states, outside the
    allocator) sum to the allocated peak exactly: both are integers, the peak is the sum of the
    terms at one moment (per-category fits of a phase sum to the fit of its peak, exactly up to
    one byte of rounding per term, and the peak is defined as that sum)."""
    m = r.memory
    c.check("breakdown term >= 0", all(v >= 0 for v in m.breakdown.values()),
            f"{_desc(r)}: {m.breakdown}")
    total = sum(v for k, v in m.breakdown.items() if k != "managed")
    c.check("terms sum to the allocated peak", total == m.peak_allocated_bytes,
            f"{_desc(r)}: sum {total} != {m.peak_allocated_bytes}")


def check_utilisation(c: Checked, r: PlanRow) -> None:
    """MFU and HFU are fractions of the device's peak: a predicted figure above 100 % is a bug
    (doctor once printed 154 %), not a fast configuration."""
    sp = r.speed
    if sp is None:
        return
    for name in ("mfu", "hfu", "device_busy_fraction"):
        v = getattr(sp, name)
        c.check(f"{name} within [0, 1]", v is None or 0 <= v <= 1, f"{_desc(r)}: {name} {v}")
    # HFU counts the matmuls MFU's 6N + 12·L·H·Q·T counts (N on the built model, attention
    # unmasked in both) plus the recomputation; LoRA's 4N for a frozen weight is an upper bound
    # (the first layer's frozen inputs take no gradient), so its model FLOPs are the lesser of
    # the formula and the executed count (speed.predict.speed_from_times): every method
    c.check("hfu >= mfu", sp.mfu is None or sp.hfu is None
            or sp.hfu >= sp.mfu * (1 - 1e-9), f"{_desc(r)}: hfu {sp.hfu} < mfu {sp.mfu}")


def check_fits(c: Checked, rows: list[PlanRow], cap: int) -> None:
    """``fits`` is device × (1 + error band) ≤ capacity and ≤ (1 − margin) × capacity (never
    with allocator retries); ▲ only on a fitting row, and on the largest
    fitting micro-batch of its group (rows of one group differ only in the micro-batch)."""
    for r in rows:
        m = r.memory
        # the band raises the device peak (resident part: paged states never decide it)
        limit = int(cap * min(1 - m.margin, 1 / (1 + m.error_band_under)))
        # a row the allocator runs only by releasing its cache at the card's limit has no
        # margin: judged on the reserve it asks for, which is past the card (memory.predict)
        c.check("fits == device within capacity",
                m.fits is False if m.alloc_retries else
                m.fits == (m.peak_device_bytes - m.breakdown.get("managed", 0) <= limit),
                _desc(r))
        c.check("largest_fitting only on a fitting row", not r.largest_fitting or m.fits is True,
                _desc(r))
    fitting = [r.job.micro_batch for r in rows if r.memory.fits]
    marked = [r.job.micro_batch for r in rows if r.largest_fitting]
    c.check("largest_fitting is the largest fitting micro-batch",
            marked == ([max(fitting)] if fitting else []),
            f"{_desc(rows[0])}: marked {marked}, fitting {fitting}")


def check_monotone(c: Checked, rows: list[PlanRow]) -> None:
    """Same everything but a larger micro-batch: the allocated peak (and the device peak built on
    it) never decreases."""
    rows = sorted(rows, key=lambda r: r.job.micro_batch)
    for a, b in itertools.pairwise(rows):
        c.check("allocated non-decreasing in micro-batch",
                b.memory.peak_allocated_bytes >= a.memory.peak_allocated_bytes,
                f"{_desc(a)} {a.memory.peak_allocated_bytes} > {_desc(b)} "
                f"{b.memory.peak_allocated_bytes}")
        c.check("device non-decreasing in micro-batch",
                b.memory.peak_device_bytes >= a.memory.peak_device_bytes,
                f"{_desc(a)} {a.memory.peak_device_bytes} > {_desc(b)} "
                f"{b.memory.peak_device_bytes}")


def check_reserved(c: Checked, r: PlanRow, model: BilinearModel) -> None:
    """reserved ≥ allocated, and within the allocator model's stated bound: an extrapolated
    row's reserve above the allocated peak is at most the larger of the group's fragmentation
    ratio ρ (the largest (reserved − allocated) ÷ (allocated − steady) of its small
    simulations, ``BilinearModel.fragmentation_ratio``) times the one-process transient bytes
    and the largest full-depth reserve replayed at a simulated micro-batch at or under the
    row's (``BilinearModel.trace_peaks``), plus one 20 MiB segment (``SEGMENT_SLACK_BYTES``:
    the reserve grows by whole segments)."""
    m = r.memory
    c.check("reserved >= allocated", m.peak_reserved_bytes >= m.peak_allocated_bytes, _desc(r))
    rho = model.fragmentation_ratio()
    c.max_fragmentation_ratio = max(c.max_fragmentation_ratio, rho)
    accumulating = (r.job.grad_accum or 1) > 1
    one = model.predict(r.job.micro_batch, accumulating=accumulating)
    traced = model.trace_peaks(r.job.micro_batch, accumulating)
    bound = max(rho * max(0, one["peak_allocated_bytes"] - one["steady_bytes"]),
                traced[1] if traced else 0) + SEGMENT_SLACK_BYTES + 1
    c.check("reserved within the allocator bound",
            m.peak_reserved_bytes - m.peak_allocated_bytes <= bound,
            f"{_desc(r)}: {m.peak_reserved_bytes - m.peak_allocated_bytes} > {bound:.0f}")


def fsdp_should_not_exceed(job: JobSpec, layers: int) -> bool:
    """Where FSDP's per-rank peak must be ≤ the one-process peak.  FSDP holds 2 unsharded layers
    in flight (ranks.FSDP_PREFETCH_UNITS): on a stack of ≤ 4 layers of frozen LoRA weights over
    2 ranks that is as much as sharding frees, so it legitimately does not pay; with trainable
    weights (gradients and optimizer states sharded too) or 8 ranks it must."""
    return job.method == "full" or (job.ranks >= 8 and layers >= 3)


def check_plan(c: Checked, res: Any) -> None:
    """A whole ``plan()``: terms and ▲ after the pick's full-size re-simulation, per group."""
    by_group: dict[tuple[str | None, str | None], list[PlanRow]] = {}
    for r in res.rows:
        c.configurations += 1
        check_terms(c, r)
        check_utilisation(c, r)
        c.check("reserved >= allocated",
                r.memory.peak_reserved_bytes >= r.memory.peak_allocated_bytes, _desc(r))
        by_group.setdefault((r.job.precision, r.job.grad_ckpt), []).append(r)
    for rows in by_group.values():
        check_fits(c, rows, res.gpu_memory_bytes)
        check_monotone(c, [r for r in rows if r.how == "extrapolated"])
