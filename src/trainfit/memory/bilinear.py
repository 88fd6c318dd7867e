"""The bilinear model of a group's peaks, from the small simulations that
:func:`trainfit.memory.extrapolate.fit_group` runs (the method: that module's docstring): each
phase's peak and breakdown as ``a + b·L + c·B + d·L·B`` in the depth L and the micro-batch B,
interpolated piecewise in B, and where the two small depths' traces make the full-depth one, its
replayed allocated peak and reserve."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from trainfit.memory.allocator import K_LARGE_BUFFER, replay
from trainfit.memory.depth_trace import Trace, aligned_runs, full_depth_trace
from trainfit.memory.rebook import as_gradients, nonnegative, rebooked
from trainfit.memory.simulate import SimResult
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
    framework_host_s: float = 0.0
    """Host seconds per micro-step of DeepSpeed ZeRO's hooks (``plan.row_speed.
    framework_host_s``; 0: none)."""
    gradients_dropped: bool = False
    """DeepSpeed ZeRO: a rank drops the one-process step's gradient (zero.py), so an uncertain
    gradient is kept a gradient, not booked as temporaries every rank holds (Llama-3-70B 8-rank
    ZeRO-3 at 1 × 8: 265 GiB against 166 at full size; tests/memory/test_zero.py)."""

    def speed(self, dev: Any, job: Any, flops_per_token: float) -> Any:
        """Predicted speed of ``job`` (its micro-batch and accumulation) on ``dev``, from the four
        points of the micro-batch's segment (:meth:`segment`), as its memory is: a step's bytes
        are not linear in the micro-batch everywhere — a compiled, checkpointed Qwen2.5-0.5B
        step's fused kernels moved 406 MB a sample between micro-batches 2 and 3 and 454 MB
        between 8 and 64, so the line through 2 and 3 put its micro-batch-64 step 13 % under the
        full-size simulation and faster than the same step without checkpointing (an audit)."""

        segment = self.segment(job.micro_batch or 1)
        try:
            return self._speed_over(segment, dev, job, flops_per_token)
        except ValueError:
            # micro-batch 1 runs other ops than 2 (a broadcast or a squeeze taken on a size-1
            # dimension): its segment cannot be paired op by op, the fit's can
            if segment is self.points:
                raise
        return self._speed_over(self.points, dev, job, flops_per_token)

    def _speed_over(self, p: list[Point], dev: Any, job: Any, flops_per_token: float) -> Any:
        """:func:`predict_speed` over four points, (L1, b1), (L2, b1), (L1, b2), (L2, b2)."""
        if not hasattr(self, "_speed_cache"):
            self._speed_cache: dict[Any, Any] = {}
        return predict_speed(dev, [p[0].ops, p[1].ops, p[2].ops, p[3].ops],
                             (p[0].layers, p[1].layers), (p[0].batch, p[2].batch),
                             self.full_layers, job.micro_batch, job.grad_accum or 1,
                             job.seq_len, job.ranks, flops_per_token, cache=self._speed_cache,
                             compiled=bool(getattr(job, "compile", False)), host=self.host,
                             framework_host_s=self.framework_host_s)

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

    def _dropped_gradients(self, phase: str, breakdown: dict[str, int], batch: int
                           ) -> dict[str, int]:
        """DeepSpeed ZeRO (a rank drops the one-process gradient, :mod:`trainfit.memory.zero`):
        ``breakdown`` with the gradient bytes that stand for another moment's activations and
        temporaries booked as temporaries (same total).

        Between the segment's two simulated micro-batches the phase can peak at different
        moments (its end, every gradient made, at the lower; its start, activations whole, at
        the upper): interpolated, the categories mix the two, and the mix's gradient — which a
        ZeRO rank replaces by its partition — held what the moment at ``batch`` holds as
        activations (Llama 16 × 256, bf16-true, checkpointed, 1,024 tokens, ZeRO-2 over 8 ranks,
        micro-batch 4: 8 % under the full-size simulation).  Each end's moment is carried to
        ``batch`` (on the line through the next simulated micro-batch beyond it where that one
        peaks at the same moment; else a lower bound: the lower end's activations as they
        were, the upper end's scaled down by the micro-batch), and the one larger in total is
        taken as the moment: where it holds more activations and temporaries than the mix and
        less gradient, the mix's gradient beyond the moment's is booked as temporaries.  Only
        between simulated micro-batches, and not the whole uncertain gradient as
        ``_certain_gradients`` books it (Llama-3-70B ZeRO-3 1 × 8: 265 GiB against 166)."""
        pts = self.segment(batch)
        lo, hi = pts[0].batch, pts[2].batch
        grads = breakdown.get("gradients", 0)
        if not lo < batch < hi or grads <= 0:
            return breakdown
        sims = self._batches()

        def at(b: int) -> dict[str, int]:
            return self._phase_breakdowns([phase], b)[phase]

        def carried(end: int, other: int | None) -> dict[str, float]:
            """The end's moment at ``batch``: on the line through the simulated micro-batch
            beyond it where that one peaks at the same moment (the same gradient bytes), else
            its transient bytes held (lower end) or scaled by the micro-batch (upper end)."""
            e = at(end)
            if other is not None:
                o = at(other)
                if o.get("gradients", 0) == e.get("gradients", 0):
                    t = (batch - end) / (other - end)
                    return {c: e.get(c, 0) + (o.get(c, 0) - e.get(c, 0)) * t
                            for c in {*e, *o}}
            scale = 1 if end < batch else batch / end
            return {**e, **{c: e.get(c, 0) * scale for c in ("activations", "temporaries")}}

        below = [b for b in sims if b < lo and b >= 2]
        above = [b for b in sims if b > hi]
        moment = max((carried(lo, below[-1] if below else None),
                      carried(hi, above[0] if above else None)),
                     key=lambda bd: sum(bd.values()))

        def transient(bd: dict[str, Any]) -> float:
            return bd.get("activations", 0) + bd.get("temporaries", 0)

        # the moment's own gradient is what the mix holds as gradient; the rest of the mix's
        # gradient stands for the moment's activations and temporaries
        want = round(moment.get("gradients", 0))
        if want < grads and transient(moment) > transient(breakdown):
            return {**breakdown, "gradients": want,
                    "temporaries": breakdown.get("temporaries", 0) + grads - want}
        return breakdown

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
        certain = {k: self._dropped_gradients(k, b, batch) for k, b in by_phase.items()} \
            if self.gradients_dropped else {
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
