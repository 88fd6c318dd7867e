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
from dataclasses import dataclass, field
from typing import Any

from trainfit.job import JobSpec
from trainfit.memory.allocator import K_LARGE_BUFFER, replay
from trainfit.memory.batch_trace import one_micro_step_trace
from trainfit.memory.depth_trace import Trace, aligned_runs, full_depth_trace
from trainfit.memory.rebook import as_gradients, nonnegative, rebooked
from trainfit.memory.simulate import SimResult, SimTarget, simulate_step
from trainfit.model.depth import layer_pattern, with_layers
from trainfit.model.source import ModelSource, layer_count
from trainfit.speed.ops import OpRecorder
from trainfit.speed.predict import predict_speed


@dataclass
class Point:
    layers: int
    batch: int
    sim: SimResult
    reserved_bytes: int
    allocated_blocks_bytes: int
    ops: list[Any] = field(default_factory=list)
    """The recorded ops of the steady-state step (speed model)."""
    traces: dict[bool, Trace] = field(default_factory=dict, repr=False)
    """Accumulating (two micro-steps) or not (one) → the step's alloc/free trace, kept for
    :meth:`BilinearModel.full_depth` (at a small depth, or at full depth for a stack that is not
    homogeneous, where only its micro-batch is interpolated): the allocator's reserve differs
    between the two (Mistral-7B amp-fp16 at micro-batch 64: 10 GiB over the
    allocated peak with one micro-step, 0.8 GiB with two)."""


@dataclass
class BilinearModel:
    """Phase peaks and totals as bilinear functions of (layers, micro-batch)."""

    points: list[Point]
    full_layers: int
    layer_extrapolated: bool
    batches: tuple[int, int] = (1, 2)
    low: list[Point] = field(default_factory=list)
    """(L1, 1), (L2, 1): micro-batch 1 at the small depths (when the grid has it)."""
    high: list[Point] = field(default_factory=list)
    """(L1, B), (L2, B) for B in :func:`upper_batches` (ascending), at the small depths."""
    accumulates: bool = True
    """The points simulated two micro-steps (accumulating rows can be predicted) or one."""
    expandable: bool = False
    """The job's allocator has expandable segments (the full-depth traces are replayed so)."""
    host: Any = None
    """The step's code measured at full depth (:class:`trainfit.speed.host.HostStep`), None:
    the op-level count alone."""
    gradients_dropped: bool = False
    """DeepSpeed ZeRO: a rank drops the one-process step's gradient (zero.py), so an uncertain
    gradient is kept a gradient, not booked as temporaries every rank holds (Llama-3-70B 8-rank
    ZeRO-3 at 1 × 8: 265 GiB against 166 at full size; tests/memory/test_zero.py)."""

    def speed(self, dev: Any, job: Any, flops_per_token: float) -> Any:
        """Predicted speed of ``job`` (its micro-batch and accumulation) on ``dev``."""

        p = self.points
        layers = (p[0].layers, p[1].layers)
        if not hasattr(self, "_speed_cache"):
            self._speed_cache: dict[Any, Any] = {}
        return predict_speed(dev, [p[0].ops, p[1].ops, p[2].ops, p[3].ops], layers,
                             self.batches, self.full_layers, job.micro_batch, job.grad_accum or 1,
                             job.seq_len, job.ranks, flops_per_token, cache=self._speed_cache,
                             compiled=bool(getattr(job, "compile", False)), host=self.host)

    def segment(self, batch: int) -> list[Point]:
        """The four points a micro-batch is predicted from: micro-batch 1 and 2 below 2, (2, 3)
        up to 3, then the chord from 3 to the largest micro-batch the grid asks for.  A phase
        peaks at the largest of several moments, each linear in the micro-batch, so its peak is
        convex in it: a line through 2 and 3 falls below it on both sides (Llama amp-fp16 with
        checkpointing: 11.8 MB extrapolated at micro-batch 64 against 20.8 MB simulated, and
        below the simulation at 1), a chord lies on or above it between its ends (at the
        simulated depths; the extrapolation in depth can still move it by a fraction of a %)."""
        if self.high and batch > self.points[2].batch:
            below = [self.points[2], self.points[3]]
            for i in range(0, len(self.high), 2):
                pair = self.high[i:i + 2]
                if batch <= pair[0].batch or i + 2 >= len(self.high):
                    return [*below, *pair]
                below = pair
        if self.low and batch < self.points[0].batch:
            return [*self.low, self.points[0], self.points[1]]
        return self.points

    def _bilinear(self, pts: list[Point], values: list[float], batch: int) -> float:
        (l1, b1), (l2, _), (_, b2) = ((p.layers, p.batch) for p in pts[:3])
        f11, f21, f12, f22 = values
        dl = (l2 - l1) or 1
        db = (b2 - b1) or 1
        d = (f22 - f21 - f12 + f11) / (dl * db)
        b = (f21 - f11) / dl - d * b1
        c = (f12 - f11) / db - d * l1
        a = f11 - b * l1 - c * b1 - d * l1 * b1
        L = self.full_layers
        return a + b * L + c * batch + d * L * batch

    def eval(self, values: list[float], batch: int) -> int:
        """``values`` at :attr:`points`, fitted and evaluated at full depth and ``batch``."""
        return round(self._bilinear(self.points, values, batch))

    def eval_at(self, value: Any, batch: int) -> int:
        """``value(point)`` over the points of ``batch``'s segment, evaluated there."""
        pts = self.segment(batch)
        return round(self._bilinear(pts, [value(p) for p in pts], batch))

    def _phase_breakdowns(self, phases: list[str], batch: int) -> dict[str, dict[str, int]]:
        """Each phase's breakdown at its own peak, every category fitted on its own.

        The phase peak is the sum of its categories at that moment, so fitting the categories
        and summing equals fitting the peak (the fit is linear in the values); fitting the
        categories of the *global* peak instead mixes moments from different phases (the peak
        moves from the optimizer to the backward as the batch grows) and gave terms that were
        negative or larger than the peak."""
        out: dict[str, dict[str, int]] = {}
        for k in phases:
            cats = sorted({c for p in self._all()
                           for c in p.sim.phase_breakdowns.get(k, {})})
            out[k] = nonnegative({c: self.eval_at(
                lambda p, k=k, c=c: p.sim.phase_breakdowns.get(k, {}).get(c, 0), batch)
                for c in cats})
        return out

    def _certain_gradients(self, phase: str, breakdown: dict[str, int], batch: int
                           ) -> dict[str, int]:
        """``breakdown`` with only the gradient bytes alive at *both* ends of the segment kept as
        gradients, the rest booked as temporaries (same total).

        Between two simulated micro-batches the peak's moment can move (the backward peaks at its
        end, gradients complete, at small batches, and at its start, activations whole, at large
        ones), so interpolated categories mix two moments.  That is harmless for the total (it
        stays on or above the peak) but not for FSDP, which divides gradients by the ranks and
        not activations: Qwen2.5-7B full, 8 ranks, amp-fp16, micro-batch 32 came out 5.3 %
        under its full-size simulation.  Parameters and optimizer states are alive throughout
        the step, the same at every batch; gradients are not."""
        pts = self.segment(batch)
        ends = [round(self._bilinear(pts, [p.sim.phase_breakdowns.get(phase, {}).get(
            "gradients", 0) for p in pts], b)) for b in (pts[0].batch, pts[2].batch)]
        grads = breakdown.get("gradients", 0)
        sure = max(0, min(grads, *ends))
        if sure == grads:
            return breakdown
        return {**breakdown, "gradients": sure,
                "temporaries": breakdown.get("temporaries", 0) + grads - sure}

    def _all(self) -> list[Point]:
        return self.points + self.low + self.high

    def _batches(self) -> list[int]:
        return sorted({p.batch for p in self._all()})

    def full_depth(self, batch: int, accumulating: bool) -> tuple[int, int] | None:
        """(allocated, reserved − allocated) of the full-depth step at ``batch``, from the replay
        of its full-depth trace (:func:`deeper_trace` over the two small depths' traces at that
        micro-batch, simulated or :func:`batch_trace`-interpolated between simulated ones), for
        the job's kind of step (one micro-step or accumulating: the reserve differs between
        them); None when the trace cannot be synthesized or is not well formed.

        The replay is the full-depth simulation's to the byte on every configuration checked,
        where the depth extrapolation of the phase peaks is not: the moment a phase peaks can
        move with depth, which a line through 3 and 4 layers cannot see (Qwen2.5-7B, 8-rank
        FSDP, amp-fp16, micro-batch 2 with accumulation: 20.59 GiB extrapolated, 25.46 GiB
        simulated at full depth and replayed from the synthesized trace); and the reserve is
        not proportional to anything that can be interpolated (Mistral-7B amp-bf16 checkpointed,
        one micro-step: 16.6, 24.5, 30.4 GiB over the peak at micro-batches 32, 48, 64)."""
        cache = self.__dict__.setdefault("_full_depth", {})
        key = (batch, accumulating)
        if key not in cache:
            cache[key] = self._replay_full_depth(batch, accumulating)
        return cache[key]

    def full_trace(self, batch: int, accumulating: bool) -> Trace | None:
        """The full-depth trace :meth:`full_depth` replays (made again at each call: a
        catalog-scale trace holds tens of thousands of events), or None."""
        traces = {(p.layers, p.batch): p.traces[accumulating] for p in self._all()
                  if accumulating in p.traces}
        cache = self.__dict__.setdefault("_aligned", {})
        depths = (self.points[0].layers, self.points[1].layers)
        if accumulating not in cache:
            cache[accumulating] = aligned_runs(traces, depths)
        return full_depth_trace(traces, depths, self.full_layers, batch, cache[accumulating])

    def _replay_full_depth(self, batch: int, accumulating: bool) -> tuple[int, int] | None:
        trace = self.full_trace(batch, accumulating)
        if trace is None:
            return None
        rep = replay(trace[0], trace[1], expandable=self.expandable)
        return rep.peak_allocated_bytes, rep.peak_reserved_bytes - rep.peak_allocated_bytes

    def trace_peaks(self, batch: int, accumulating: bool) -> tuple[int, int, int] | None:
        """(allocated, reserve floor, reserve cap) at ``batch`` from the full-depth traces, or
        None; the allocated peak and the reserved total never below those of a smaller simulated
        micro-batch (more samples never need fewer bytes; the reserve over the peak can fall:
        Mistral-7B amp-fp16, one micro-step, 12.7 GiB at micro-batch 12, 0.15 GiB at 16).

        Where the trace at ``batch`` is made (:meth:`full_depth`) floor and cap are its reserve.
        Where only the simulated micro-batches' are (the traces between them are not the same
        sequence of blocks), the allocated peak is the chord between the simulated ones on each
        side (a phase peaks at the largest of several moments, each linear in the micro-batch:
        convex, so the chord is on or above it) and the reserve lies between the floor and the
        largest full-depth reserve through the next simulated micro-batch (the cap): the
        allocator's reserve is not proportional to anything (Mistral-7B amp-fp16, one
        micro-step: 0.16 GiB at micro-batch 16, 9.9 GiB at 64)."""
        traced = [b for b in self._batches()
                  if all(accumulating in p.traces for p in self._all() if p.batch == b)]
        sims = {b: v for b in traced if (v := self.full_depth(b, accumulating)) is not None}
        if len(sims) < len(traced):
            return None  # a simulated micro-batch's trace is not synthesized: trust none
        below = [b for b in sims if b <= batch]
        got = self.full_depth(batch, accumulating)
        if got is not None:
            alloc = max([got[0], *(sims[b][0] for b in below)])
            # the reserved total, not the reserve over the peak, never falls with the batch
            reserve = max([alloc + got[1], *(sum(sims[b]) for b in below)]) - alloc
            return alloc, reserve, reserve
        above = [b for b in sims if b >= batch]
        if not below or not above:
            return None
        lo, hi = below[-1], above[0]
        a_lo, a_hi = sims[lo][0], sims[hi][0]
        alloc = round(a_lo + (a_hi - a_lo) * (batch - lo) / (hi - lo))
        alloc = max(alloc, *(sims[b][0] for b in below))
        return alloc, max(sims[b][1] for b in below), max(sims[b][1] for b in [*below, hi])

    def fragmentation_ratio(self) -> float:
        """The largest (reserved − allocated) ÷ (allocated − steady) of the four simulations.

        The caching allocator's reserve above the allocated peak is not bilinear in (L, B):
        fitted bilinearly it went negative (an OOM under-predicted by 8 GiB on Mistral-7B
        bf16-true at micro-batch 16) or grew to 84 GiB over the peak (Qwen2.5-7B).  Freed
        blocks that later requests cannot reuse are carved from the step's transient bytes, so
        the reserve is modelled as a share of them, the largest share the simulations showed:
        measured against full-depth replays of those two and Mistral-7B LoRA, never below the
        replay (benchmarks/results/invariants.md)."""
        ratios = [(p.reserved_bytes - p.allocated_blocks_bytes)
                  / (p.allocated_blocks_bytes - p.sim.steady_bytes)
                  for p in self._all()
                  if p.allocated_blocks_bytes > p.sim.steady_bytes]
        return max([0.0, *ratios])

    def _anchors(self, batch: int) -> list[int]:
        """The simulated micro-batches up to ``batch``, and ``batch``."""
        return sorted({p.batch for p in self._all() if p.batch < batch} | {batch})

    def _monotone(self, by_phase: dict[str, dict[str, int]], phases: list[str], batch: int
                  ) -> dict[str, dict[str, int]]:
        """Each phase at least as large as at any simulated micro-batch below ``batch``.

        A segment is linear in the micro-batch, but extrapolated in depth from 2 and 3 layers its
        slope can come out negative where the moment of the peak moves with depth (Mistral-7B
        amp, checkpointing: micro-batch 8 read 225 kB below 4).  More samples never need fewer
        bytes, so the shortfall is booked as temporaries (what the moment that moved held)."""
        out = dict(by_phase)
        for b in self._anchors(batch)[:-1]:
            lower = self._phase_breakdowns(phases, b)
            for k in phases:
                short = sum(lower[k].values()) - sum(out[k].values())
                if short > 0:  # under ZeRO the lower batch's gradient stays a gradient
                    out[k] = rebooked(*as_gradients(out[k], short, lower[k].get(
                        "gradients", 0) if self.gradients_dropped else 0))
        return out

    def predict(self, batch: int, accumulating: bool) -> dict[str, Any]:
        if accumulating and not self.accumulates:
            raise ValueError("an accumulating row from one-micro-step simulations: pass the "
                             "row to fit_group(rows=...)")
        phases = sorted({k for p in self.points for k in p.sim.phase_peaks if k != "setup"})
        if not accumulating:
            phases = [k for k in phases if not k.endswith("@accum")]
        by_phase = self._monotone(self._phase_breakdowns(phases, batch), phases, batch)
        certain = dict(by_phase) if self.gradients_dropped else {
            k: self._certain_gradients(k, b, batch) for k, b in by_phase.items()}
        phase = max(by_phase, key=lambda k: sum(by_phase[k].values()))
        tensor_peak = sum(by_phase[phase].values())
        block_overhead = max([0, *(self.eval_at(
            lambda p: p.allocated_blocks_bytes - p.sim.peak_allocated_bytes, b)
            for b in self._anchors(batch))])
        # what stays between steps (weights, states) does not grow with the batch: the smallest
        # of the simulated batches', so the transient bytes, and the reserve on them, never
        # shrink as the micro-batch grows
        steady = min(self.eval_at(lambda p: p.sim.steady_bytes, p.batch)
                     for p in self._all())
        allocated = tensor_peak + block_overhead
        breakdown = by_phase[phase]
        traced = self.trace_peaks(batch, accumulating)
        if traced is not None:
            # the full-depth trace's peak where the phase fits' moment moved with depth; what
            # it holds beyond (or short of) them is booked as temporaries (then activations)
            delta = traced[0] - allocated
            # a ZeRO rank drops the gradient: what the trace holds beyond the fits is gradient
            whole = by_phase.get("optimizer", {}).get("gradients", 0) \
                if self.gradients_dropped else 0
            breakdown = rebooked(*as_gradients(breakdown, delta, whole))
            certain[phase] = rebooked(*as_gradients(certain[phase], delta, whole))
            allocated = sum(breakdown.values()) + block_overhead
        reserve = round(self.fragmentation_ratio() * max(0, allocated - steady))
        if traced is not None:
            reserve = max(traced[1], min(traced[2], reserve))
        return {
            "peak_allocated_bytes": allocated,
            "peak_phase": phase.split("@")[0],
            "breakdown": breakdown,
            "phase_breakdowns": certain,
            "reserved_bytes": allocated + SEGMENT_SLACK_BYTES + reserve,
            "steady_bytes": steady,
            "managed_bytes": self.eval([p.sim.managed_bytes for p in self.points], batch),
            "total_params": self.eval([p.sim.total_params for p in self.points], batch),
            "trainable_params": self.eval([p.sim.trainable_params for p in self.points], batch),
            "matmul_params": self.eval([p.sim.info.get("matmul_params", 0) for p in self.points],
                                       batch),
            "packed_4bit_params": self.eval([p.sim.info.get("packed_4bit_params", 0)
                                             for p in self.points], batch),
            "quant_state_bytes": self.eval([p.sim.quant_state_bytes for p in self.points], batch),
        }


SEGMENT_SLACK_BYTES = K_LARGE_BUFFER
"""The reserve grows by whole segments (20 MiB for requests under 10 MiB: ``kLargeBuffer`` in
c10/cuda/CUDACachingAllocator.cpp), which a share of bytes cannot resolve: a full-depth step
needed one 20 MiB segment more than the share predicted (tiny Llama, bf16-true)."""


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
    return BilinearModel(ordered, full, extrap, batches, [low[0], low[-1]] if low else [], high,
                         accumulates, expandable=job.expandable_segments,
                         gradients_dropped=job.sharding in ("zero2", "zero3"))
