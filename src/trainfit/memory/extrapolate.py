"""Exact extrapolation of the simulated step from small simulations.

In a homogeneous decoder stack every layer allocates the same, and at a fixed sequence length
every activation scales with the micro-batch, so each phase's peak (forward, backward of the first
and of later micro-batches, optimizer) is bilinear in layers L and micro-batch B:
``f(L, B) = a + b·L + c·B + d·L·B``.  Four simulations at L ∈ {2, 3}, B ∈ {2, 3} fix it; the peak
is the max over phases (fitting the max itself would not be bilinear where the peak moves from the
optimizer to the backward), and each phase's breakdown is fitted category by category, so the
terms sum to the peak.  Within a phase the peak is the largest of several moments, so it is convex,
not linear, in B: micro-batch 1 and the largest micro-batch the grid needs are simulated too (at
the same small depths; a fake tensor costs the same at any size) and B is interpolated piecewise
(``BilinearModel.segment``): at the simulated depths exact at the simulated batches and on or
above the peak between them.  Extrapolated in depth, a phase's peak can move to another moment
at full depth than at 2-3 layers (Qwen2.5-7B, 8-rank FSDP, amp-fp16, 2×2: 20.59 GiB against
25.46 simulated at full depth), so where the two small depths' alloc/free traces, interpolated
to the row's micro-batch, make the full-depth one (:mod:`trainfit.memory.depth_trace`) its
replayed allocated peak and reserve are the row's: the full-size simulation's on the catalog-scale
rows checked (benchmarks/results/invariants.md; benchmarks/planner_speed.py re-checks it).

A stack of layers that are not all alike is homogeneous in its repeating pattern (Gemma-2's
sliding + global pair, DeepSeek-V3's dense prefix then expert layers, :mod:`trainfit.model.depth`):
L then counts whole repeats, the small stacks being 2 and 3 of them.  A stack without one whose
small stacks are shallower than itself (a hybrid with one global layer in ten, an encoder-decoder)
is simulated at full depth (still extrapolated in B).
"""

from __future__ import annotations

import math

from trainfit.job import JobSpec
from trainfit.memory.allocator import replay
from trainfit.memory.batch_trace import one_micro_step_trace
from trainfit.memory.bilinear import BilinearModel, Point
from trainfit.memory.depth_trace import Trace, aligned_runs, full_depth_trace
from trainfit.memory.simulate import SimTarget, simulate_step
from trainfit.model.depth import layer_pattern, with_layers
from trainfit.model.source import ModelSource, layer_count
from trainfit.speed.ops import OpRecorder

FIT_REPEATS = (2, 3)
"""Depths of the small simulations, in repeats of the stack's pattern (layers, for a stack of one
layer repeated; :mod:`trainfit.model.depth`).  Not 1: a one-layer stack's first layer is also its last, and
the moment a phase peaks moved between depth 1 and 2 (Llama, amp-fp16, checkpointing: the
backward's slope in the micro-batch fell with depth, so micro-batch 2 extrapolated below 1 and
micro-batch 32 to 2.7 × its full-size peak); from depth 2 on the peak is at the same layer."""
SHARDED_FIT_REPEATS = (3, 4)
"""Depths of the small simulations under FSDP / ZeRO (in repeats, as above).  At depth 2 the
backward's peak falls at another moment than at any deeper stack (the root's gathered embedding
and head, the prefetch of the next unit and the first layer's all meet): Qwen2.5-7B full, 8 ranks,
fp32, micro-batch 1 read 2.6 GiB more FSDP buffers and 1.2 GiB more temporaries at depth 2 than
at 3-6, where they are constant, and its extrapolation came out at 2.6 × the full-size
simulation."""
FIT_BATCHES = (2, 3)
"""Micro-batches of the small simulations.  Not 1: at batch 1 some ops are skipped (a clone of an
expanded batch dimension), so 1 → 2 is not the per-sample slope of larger batches."""


def upper_batches(top_fit: int, high_batch: int | None) -> list[int]:
    """The micro-batches simulated above the fit's: the largest one wanted, and, when it is far
    above, the power of two nearest the geometric middle (a chord over a shorter span lies
    closer to the convex peak: Qwen2.5-7B FSDP micro-batch 8 read 3.5 % over its full-size
    simulation with one chord from 3 to 256)."""
    if high_batch is None or high_batch <= top_fit:
        return []
    mid = 1 << round(math.log2(math.sqrt(top_fit * high_batch)))
    return sorted({high_batch} | ({mid} if top_fit * 2 < mid < high_batch else set()))


def _point(job: JobSpec, source: ModelSource, target: SimTarget, layers: int, batch: int,
           extrap: bool, accumulates: bool, one_step_trace: bool) -> Point:
    """The simulation at (``layers``, ``batch``): two micro-steps when ``accumulates`` (the
    phases of an accumulating step include those of a one-step step), else one; with
    ``one_step_trace`` an accumulating point also takes the one-micro-step step's trace (the
    allocator's reserve differs between the two kinds of step): cut from its own where that is
    exact (:func:`~trainfit.memory.batch_trace.one_micro_step_trace`), else simulated."""
    src = with_layers(source, layers) if extrap else source
    j = job.replace(micro_batch=batch, grad_accum=2 if accumulates else 1, effective_batch=None)
    rec = OpRecorder()
    sim = simulate_step(j, src, target, record_events=True, op_hook=rec)
    rep = replay(sim.events, sim.event_streams, expandable=job.expandable_segments)
    traces: dict[bool, Trace] = {}
    # the traces make the full-depth one at any micro-batch (BilinearModel.full_depth)
    traces[accumulates] = (sim.events, sim.event_streams, sim.event_phases)
    if accumulates and one_step_trace:
        # cut from this step's own trace (a third of a plan's simulations were these); not for
        # the steps the cut was not checked on: DeepSpeed's, torch.compile's partitioned blocks
        unchecked = j.compile or j.sharding in ("zero2", "zero3")
        cut = None if unchecked else one_micro_step_trace(traces[True])
        if cut is None:
            one = simulate_step(j.replace(grad_accum=1), src, target, record_events=True)
            cut = (one.events, one.event_streams, one.event_phases)
        traces[False] = cut
    sim.events = []
    sim.event_streams = {}
    sim.event_phases = []
    return Point(layers, batch, sim, rep.peak_reserved_bytes, rep.peak_allocated_bytes, rec.ops,
                 traces)


def _one_step_batches(simulated: list[int], one_step: list[int]) -> set[int]:
    """The simulated micro-batches whose one-micro-step traces the rows in ``one_step`` are
    predicted from (:meth:`BilinearModel.trace_peaks`: the simulated one at or below each and
    the one at or above), and two of them ≥ 2 at least (:func:`~trainfit.memory.depth_trace.aligned_runs`)."""
    out: set[int | None] = set()
    for m in one_step:
        out |= {max([b for b in simulated if b <= m], default=None),
                min([b for b in simulated if b >= m], default=None)}
    got = {b for b in out if b is not None}
    big = {b for b in got if b >= 2}
    if len(big) == 1:  # the alignment needs two
        more = min((b for b in simulated if b >= 2 and b not in big), default=None)
        got |= {more} if more is not None else set()
    return got


def _traces_extend(points: list[Point], depths: tuple[int, int], full: int,
                   accumulates: bool) -> bool:
    """Whether the two small depths' traces (at the fit's micro-batches) make the full-depth
    trace (:func:`~trainfit.memory.depth_trace.full_depth_trace`)."""
    traces = {(p.layers, p.batch): p.traces[accumulates] for p in points}
    batch = min(b for _, b in traces)
    return full_depth_trace(traces, depths, full, batch, aligned_runs(traces, depths)) is not None


def fit_group(job: JobSpec, source: ModelSource, target: SimTarget,
              batches: tuple[int, int] = FIT_BATCHES, high_batch: int | None = None,
              rows: list[tuple[int, bool]] | None = None) -> BilinearModel:
    """Simulate ``job`` (its micro-batch ignored) at 4 small points, accumulation included; with
    ``high_batch`` (the largest micro-batch wanted; a fake tensor costs the same time at any
    size) also at it and at micro-batch 1, at both small depths (see ``_segment``).

    ``rows``: the (micro-batch, accumulating) rows the model will be asked for (None: any).
    Only the kinds of step they take are simulated: one micro-step per point when none
    accumulates, and the one-micro-step traces only at the micro-batches a one-step row is
    predicted from (a plan with an effective batch has one such row, the largest micro-batch)
    — each cut from the point's own trace, or where it cannot be, a simulation as long as the
    point's."""
    _, full = layer_count(source)
    repeats = SHARDED_FIT_REPEATS if job.ranks > 1 and job.sharding != "none" else FIT_REPEATS
    # the small stacks are 2 and 3 (sharded: 3 and 4) repeats of the stack's pattern: layers
    # for Llama, sliding + global pairs for Gemma-2 (trainfit.model.depth); None where there is
    # none, or where the two small stacks together are no shallower than the full one, which
    # then costs no more to simulate whole (a simulation's time is a fixed part — build,
    # embedding, head, optimizer — plus one per layer), and whole it is exact: 4-layer Llama
    # plan 71 → 52 s, the same allocated peaks
    pattern = layer_pattern(source, repeats, job.trust_remote_code)
    extrap = pattern is not None
    depths = (pattern.depth(repeats[0]), pattern.depth(repeats[1])) if pattern else (full,)
    highs = upper_batches(batches[1], high_batch)
    lows = [1] if high_batch is not None and batches[0] > 1 else []
    # optimizer_in_backward never accumulates (JobSpec refuses it)
    accumulates = (rows is None or any(acc for _, acc in rows)) and not job.optimizer_in_backward
    one_step = _one_step_batches(sorted({*lows, *batches, *highs}),
                                 [m for m, acc in rows if not acc]) if rows is not None \
        else {*lows, *batches, *highs}

    done: dict[tuple[int, int], Point] = {}

    def point(layers: int, batch: int) -> Point:
        # with one depth (a stack too shallow to extrapolate) the pairs below name the same
        # point twice: simulate it once (a Point is read-only once made)
        if (layers, batch) not in done:
            done[(layers, batch)] = _point(job, source, target, layers, batch, extrap,
                                           accumulates, batch in one_step)
        return done[(layers, batch)]

    pts = {(L, b): point(L, b) for L in depths for b in batches}
    if pattern is not None and (pattern.period > 1 or pattern.prefix) and \
            not _traces_extend(list(pts.values()), depths, full, accumulates):
        # a repeat of unlike layers whose small stacks' traces do not align into the full
        # one (Gemma-3's sixes did, until a block whose size grows with the depth was
        # resized in the alignment, depth_trace._grown_block): without the full-depth trace
        # the phase fits alone
        # can miss a peak moment that moves with depth, so the stack is simulated whole, as
        # it was before repeats were extrapolated (a stack of one layer repeated keeps its
        # phase fits, checked on the catalog: benchmarks/results/invariants.md)
        extrap, depths = False, (full,)
        done.clear()
        pts = {(full, b): point(full, b) for b in batches}
    high = [point(L, b) for b in highs for L in (depths[0], depths[-1])]
    low = [point(L, 1) for L in depths] if lows else []
    l1, l2 = depths[0], depths[-1]
    # order: (L1,b1), (L2,b1), (L1,b2), (L2,b2); one depth: the same twice, the L terms vanish
    ordered = [pts[(l1, batches[0])], pts[(l2, batches[0])], pts[(l1, batches[1])],
               pts[(l2, batches[1])]]
    return BilinearModel(ordered, full, extrap, [low[0], low[-1]] if low else [], high,
                         accumulates, expandable=job.expandable_segments,
                         gradients_dropped=job.sharding in ("zero2", "zero3"))
