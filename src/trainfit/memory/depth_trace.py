"""The caching allocator's trace of a full-depth step, built from the traces of two small depths.

The allocated peak of a homogeneous stack extrapolates exactly in depth (bilinear, see
:mod:`trainfit.memory.extrapolate`), the allocator's reserve above it does not: which freed blocks
later requests can reuse depends on the whole sequence of allocations and frees, and the reserve
over the peak moved from 2.4 GiB at 2-3 layers to 10 GiB at 32 (Mistral-7B amp-fp16, micro-batch
64) or from 11 GiB to 9 GiB (Qwen2.5-7B, 8-rank FSDP).  A share of the transient bytes measured at
the small depths had to be the largest one seen to stay safe, and then read up to 20 × the
full-depth replay.

So the trace itself is extrapolated.  The trace at depth ``b`` is the trace at depth ``a`` with
the events of ``b − a`` more layers inserted (a layer's forward, its recomputation, its backward,
its share of every foreach optimizer op); the two traces are aligned on (alloc or free, bytes,
stream) and the inserted runs are the layer's events.  Repeating each run ``extra`` more times
gives the trace of ``b + extra`` layers, with

* the ids of blocks allocated inside the runs made unique per copy (a copy frees its own
  activations, gradients and temporaries);
* the copies in the order their phase runs the layers: the backward runs them last layer first,
  so its first copy frees what the forward's last copy saved (the phases are the tracker's
  ``event_phases``; freeing them first-in-first-out left every size and the allocated peak
  right but freed other blocks than the step does: Mistral-7B amp-fp16 at micro-batch 8 read a
  reserve of 1.0 GiB against 7.5 GiB simulated at full depth);
* the blocks a layer passes on chained: a block the layer frees but did not allocate (the
  previous layer's output, the next layer's input gradient) is, for the second copy on, the
  block the copy run before passed out (paired by size and stream, in order), and the one copy
  left over is the one the rest of the step frees.

Replayed through :func:`trainfit.memory.allocator.replay`, the synthesized trace gives the
allocated peak and the reserve of the full-depth simulation itself, to the byte on the
catalog-scale configurations checked (Mistral-7B at every precision, Llama-2-7B LoRA, Qwen2.5-7B
with 2- and 8-rank FSDP), with exceptions of a few hundred MiB of reserve: Mistral-7B
bf16-true 4×1 +468 MiB (benchmarks/results/invariants.md), amp-bf16 checkpointed 12×1 −204 MiB
(0.18 % of its reserved total: an alignment choice the phase order does not resolve).  When
the traces do not differ by repeated runs (anything but insertions, or a passed-on block
without a partner) there is no synthesized trace and the caller keeps its share model.
"""

from __future__ import annotations

import bisect
import difflib
import math
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

Trace = tuple[Any, ...]
"""(events, streams[, phases]): (block id, +bytes) allocations and (block id, −bytes) frees in
order; the stream of each block not on the default one; and (event index, phase) where each
phase begins (``LiveBytesTracker.event_phases``; without it every layer run is taken to go in
the forward order)."""


_COPY = 1 << 42
"""Id offset between copies of the inserted layer (block ids are sequence numbers far below it)."""


def _streams_in_order(trace: Trace) -> dict[int, int]:
    """Block id → stream as 1, 2, … by first appearance: the streams are Python objects whose
    ids differ from one simulation to the next; their order of use does not."""
    events, streams = trace[0], trace[1]
    order: dict[int, int] = {}
    out: dict[int, int] = {}
    for uid, _ in events:
        s = streams.get(uid)
        if s:
            out[uid] = order.setdefault(s, len(order) + 1)
    return out


def _backward(trace: Trace) -> Any:
    """Event index → whether it falls in the backward (False throughout without phases)."""
    marks = trace[2] if len(trace) > 2 else []
    starts = [i for i, _ in marks]

    def at(j: int) -> bool:
        k = bisect.bisect_right(starts, j) - 1
        return k >= 0 and marks[k][1] == "backward"
    return at


@dataclass
class LayerRuns:
    """How a deeper trace differs from a shallower one by repeated runs of events (the alignment
    :func:`deeper_trace` extends; one per pair of traces, whatever the depth it is extended to)."""

    ops: list[tuple[str, int, int, int, int]]
    """difflib's opcodes from the shallow trace to the deeper one (equal or insert only)."""
    events: list[tuple[int, int]]
    """The deeper trace's events."""
    streams: dict[int, int]
    """Block id → stream, numbered by first use."""
    made_inside: dict[int, bool]
    """Block allocated in an inserted run → whether that run is in the backward."""
    passed: dict[int, int]
    """Block a run frees but did not allocate → the block the run passes out in its place."""
    chain: dict[int, tuple[bool, bool]]
    """Passed-out block → (freed by a run going against its maker's order, freed before it)."""
    backward: Any
    """Event index → whether it falls in the backward."""


def layer_runs(shallow: Trace, deeper: Trace) -> LayerRuns | None:
    """The repeated runs between ``shallow`` and ``deeper`` (the same step at depths one or more
    layers apart), or None when they differ by anything but insertions or a passed-on block has
    no partner (see the module docstring)."""
    sa, sb = _streams_in_order(shallow), _streams_in_order(deeper)
    ev_b = deeper[0]
    ta = [(d > 0, abs(d), sa.get(u, 0)) for u, d in shallow[0]]
    tb = [(d > 0, abs(d), sb.get(u, 0)) for u, d in ev_b]
    ops = difflib.SequenceMatcher(None, ta, tb, autojunk=False).get_opcodes()
    if any(tag not in ("equal", "insert") for tag, *_ in ops):
        return None
    inside = [False] * len(ev_b)
    for tag, _, _, j1, j2 in ops:
        if tag == "insert":
            inside[j1:j2] = [True] * (j2 - j1)
    alloc_in = {u for (u, d), ins in zip(ev_b, inside, strict=True) if d > 0 and ins}
    alloc_out = {u for (u, d), ins in zip(ev_b, inside, strict=True) if d > 0 and not ins}
    taken: dict[tuple[int, int], list[int]] = defaultdict(list)  # freed inside, made outside
    given: dict[tuple[int, int], list[int]] = defaultdict(list)  # made inside, freed outside
    for (u, d), ins in zip(ev_b, inside, strict=True):
        if d < 0 and ins and u in alloc_out:
            taken[(-d, sb.get(u, 0))].append(u)
        elif d < 0 and not ins and u in alloc_in:
            given[(-d, sb.get(u, 0))].append(u)
    if {k: len(v) for k, v in taken.items()} != {k: len(v) for k, v in given.items()}:
        return None
    passed = {x: y for k in taken for x, y in zip(taken[k], given[k], strict=True)}
    backward = _backward(deeper)
    where = {u: j for j, (u, d) in enumerate(ev_b)}  # the free's index (a free comes last)
    made = {u: backward(j) for j, (u, d) in enumerate(ev_b) if d > 0 and inside[j]}
    chain = {y: (backward(where[x]) != made[y], where[y] < where[x]) for x, y in passed.items()}
    return LayerRuns(ops, ev_b, sb, made, passed, chain, backward)


def deeper_trace(shallow: Trace, deeper: Trace, extra_layers: int, sized: Trace | None = None,
                 runs: LayerRuns | None = None) -> Trace | None:
    """The trace of ``deeper``'s depth + ``extra_layers``, or None (see the module docstring).
    ``shallow`` and ``deeper`` must be the same step at depths one or more layers apart
    (``runs``: their :func:`layer_runs`, when already made).

    ``sized``: ``deeper``'s blocks (the same ids in the same order) at another micro-batch, whose
    sizes the synthesized trace takes.  The alignment, and the pairing of the blocks a layer
    passes on, go by size, and at some micro-batches an activation is as large as a weight
    (Mistral-7B at micro-batch 8 × 512 tokens: an fp16 (tokens, 4096) activation and the fp16
    autocast copy of a 4096 × 4096 weight are both 32 MiB); a pairing by the wrong block leaves
    every size in place and the allocated peak right, but frees other blocks than the step does.
    Aligned at a micro-batch where sizes do not coincide by accident (:data:`ALIGN_AT`), the
    trace is then sized at the row's."""
    r = runs or layer_runs(shallow, deeper)
    if r is None:
        return None
    if sized is not None and [u for u, _ in sized[0]] != [u for u, _ in r.events]:
        return None
    size = [d for _, d in (sized or deeper)[0]]
    # Which copy a free takes.  Copies run in the order of their phase: the forward's from the
    # first layer up, the backward's from the last layer down, so a backward copy frees what
    # the forward copy at the other end saved (copy E − c), and within one direction copy c
    # frees copy c's.  A block one copy passes on (made inside, freed outside the repeated
    # runs) is freed by the next copy to run and, for one copy, by the rest of the step: where
    # that free comes before the taking copies it takes the first copy to run, else the last.
    last = extra_layers

    def taken_copy(y: int, c: int) -> int:
        """The copy of given block ``y`` that the taking run's copy ``c`` ≥ 1 frees."""
        against, before = r.chain[y]
        return (last - c if before else last - c + 1) if against else (c if before else c - 1)

    def rest_copy(y: int) -> int:
        """The copy of given block ``y`` that the rest of the step frees."""
        against, before = r.chain[y]
        return (last if before else 0) if against else (0 if before else last)

    events: list[tuple[int, int]] = []
    for tag, _, _, j1, j2 in r.ops:
        chunk = [(*r.events[j], size[j]) for j in range(j1, j2)]
        if tag == "equal":
            events += [(u + rest_copy(u) * _COPY if d < 0 and u in r.made_inside else u, n)
                       for u, d, n in chunk]
            continue
        rev = r.backward(j1)
        for c in range(extra_layers + 1):
            for u, d, n in chunk:
                if d > 0:
                    events.append((u + c * _COPY if u in r.made_inside else u, n))
                elif c and u in r.passed:  # what the copy run before passed on
                    events.append((r.passed[u] + taken_copy(r.passed[u], c) * _COPY, n))
                elif u in r.made_inside:
                    events.append((u + (last - c if r.made_inside[u] != rev else c) * _COPY, n))
                else:
                    events.append((u, n))
    sb = r.streams
    streams = {u: sb[u % _COPY] for u, d in events if d > 0 and u % _COPY in sb}
    return events, streams  # no phases: a synthesized trace is replayed, not extended again


ALIGN_AT = 1 / math.sqrt(2)
"""Where between two traced micro-batches the traces are aligned (:func:`batch_trace` at
``b1 + ALIGN_AT·(b2 − b1)``): an irrational micro-batch, at which an activation's bytes
(proportional to it) cannot equal a weight's by accident."""


def malformed(events: list[tuple[int, int]]) -> int:
    """Frees of blocks not live and allocations of live ids: a trace starts after the model is
    built, so frees of blocks made before it are in every trace (a fixed number per layer); a
    synthesized trace must have the count its depth implies, or a copy was chained wrongly."""
    live: set[int] = set()
    bad = 0
    for uid, delta in events:
        if delta > 0:
            bad += uid in live
            live.add(uid)
        elif uid in live:
            live.discard(uid)
        else:
            bad += 1
    return bad


def batch_trace(lo: Trace, lo_batch: int, hi: Trace, hi_batch: int, batch: int) -> Trace | None:
    """The trace at micro-batch ``batch`` from those of the same step at ``lo_batch`` and
    ``hi_batch`` (same depth, both ≥ 2), or None when they are not the same sequence of blocks.

    At a fixed sequence length every block is a weight-sized one (the same at any micro-batch) or
    an activation-sized one (proportional to it), so where the two traces allocate and free the
    same blocks in the same order (the same ids, streams and order: the program does not branch
    on the micro-batch) each block's bytes are affine in the micro-batch and the trace between is
    the interpolation, rounded up.  Replayed at full depth it gave the allocated peak and the
    reserve of the full-size simulation to 0.001 GiB at micro-batches 16, 48, 64 and 128 from
    traces at 3 and 256 (Mistral-7B amp-bf16, checkpointed, one micro-step), where the reserve
    is far from linear in the micro-batch (0.8, 24.5, 30.4 and 46.3 GiB over the peak).  At
    micro-batch 1 a few copies of an expanded batch dimension are skipped, so the traces differ
    from 2's in their blocks and are never interpolated from."""
    ev_lo, st_lo, ev_hi = lo[0], lo[1], hi[0]
    if len(ev_lo) != len(ev_hi) or _streams_in_order(lo) != _streams_in_order(hi):
        return None
    if any(u != v or (a > 0) != (b > 0) for (u, a), (v, b) in zip(ev_lo, ev_hi, strict=True)):
        return None
    t = (batch - lo_batch) / (hi_batch - lo_batch)
    events = []
    for (u, a), (_, b) in zip(ev_lo, ev_hi, strict=True):
        n = math.ceil(abs(a) + (abs(b) - abs(a)) * t)  # alloc and free: the same bytes
        events.append((u, n if a > 0 else -n))
    return events, st_lo, *lo[2:]


def trace_at(traces: dict[int, Trace], batch: float) -> Trace | None:
    """The trace at ``batch`` of one depth's ``traces`` (micro-batch → trace): simulated, or
    interpolated between the simulated micro-batches (≥ 2) on each side."""
    if batch in traces:
        return traces[batch]
    lo = max((b for b in traces if 2 <= b < batch), default=None)
    hi = min((b for b in traces if b > batch), default=None)
    if lo is None or hi is None:
        return None
    return batch_trace(traces[lo], lo, traces[hi], hi, batch)


def _at_depth(traces: dict[tuple[int, int], Trace], layers: int) -> dict[int, Trace]:
    return {b: t for (n, b), t in traces.items() if n == layers}


def aligned_runs(traces: dict[tuple[int, int], Trace], depths: tuple[int, int]
                 ) -> LayerRuns | None:
    """The :func:`layer_runs` of the two depths' traces at an irrational micro-batch between the
    two smallest simulated at both (≥ 2, :data:`ALIGN_AT`), which extend the traces of every
    micro-batch ≥ 2 (their blocks are the same); ``traces``: (layers, micro-batch) → trace."""
    both = sorted(b for (n, b) in traces if n == depths[0] and b >= 2 and (depths[1], b) in traces)
    if len(both) < 2 or depths[0] == depths[1]:
        return None
    at = both[0] + ALIGN_AT * (both[1] - both[0])
    lo, hi = (trace_at(_at_depth(traces, n), at) for n in depths)
    return None if lo is None or hi is None else layer_runs(lo, hi)


def full_depth_trace(traces: dict[tuple[int, int], Trace], depths: tuple[int, int],
                     full_layers: int, batch: int, aligned: LayerRuns | None
                     ) -> Trace | None:
    """The full-depth trace at ``batch`` from the two small ``depths``' ``traces`` ((layers,
    micro-batch) → trace), extended by ``aligned`` (:func:`aligned_runs`) where it can; None when
    it cannot be made or frees other blocks than its depth implies (:func:`malformed`: the
    frees of blocks made before the trace began are a fixed number per layer)."""
    lo, hi = (trace_at(_at_depth(traces, n), batch) for n in depths)
    if lo is None or hi is None or depths[1] == full_layers:
        return hi  # simulated at full depth (a stack that is not homogeneous): nothing to extend
    extra = full_layers - depths[1]
    trace = None if aligned is None or batch < 2 else \
        deeper_trace(lo, hi, extra, sized=hi, runs=aligned)
    if trace is None:
        trace = deeper_trace(lo, hi, extra)
    if trace is None:
        return None
    bad_hi = malformed(hi[0])
    per_layer = (bad_hi - malformed(lo[0])) / (depths[1] - depths[0])
    return trace if malformed(trace[0]) == round(bad_hi + extra * per_layer) else None


def one_micro_step_trace(trace: Trace) -> Trace | None:
    """The trace of the same step with one micro-step, cut from the trace of a step of two.

    Up to the second micro-step's forward the two steps run the same ops on the same tensors, and
    from its optimizer phase on as well (the gradients are the same tensors, accumulated in
    place): the cut drops the second micro-step's events and everything it allocated, and moves
    the frees it made of earlier blocks (the first micro-step's loss, kept by the step for its
    result) to where the one-micro-step step frees them, at its end.  Checked equal, event for
    event, to the simulated one-micro-step trace (tests/memory/test_depth_trace.py).  None unless
    the trace has exactly the two forwards of one such step: a simulation whose first step ran
    in full (a loop holding its outputs, FSDP's sharded step) has four, and its cut would not be
    the one-micro-step step's."""
    events, streams, phases = trace[0], trace[1], trace[2] if len(trace) > 2 else []
    forwards = [i for i, p in phases if p == "forward"]
    if len(forwards) != 2:
        return None
    cut_from = forwards[1]
    cut_to = next((i for i, p in phases if p == "optimizer" and i > cut_from), None)
    if cut_to is None:
        return None
    # ≥: an optimizer phase without allocations (SGD, gradients kept) marks idle at its own index
    end = next((i for i, p in phases if p == "idle" and i >= cut_to), len(events))
    made = {uid for uid, delta in events[cut_from:cut_to] if delta > 0}

    def kept(lo: int, hi: int) -> list[tuple[int, int]]:
        return [e for e in events[lo:hi] if e[0] not in made]

    head, step_end, after = events[:cut_from], kept(cut_to, end), kept(end, len(events))
    moved = [e for e in events[cut_from:cut_to] if e[1] < 0 and e[0] not in made]

    def new_index(i: int) -> int:  # a phase mark at i ≥ cut_to; the moved frees follow idle
        if i <= end:
            return len(head) + len(kept(cut_to, i))
        return len(head) + len(step_end) + len(moved) + len(kept(end, i))

    marks = [(i, p) for i, p in phases if i < cut_from] + \
        [(new_index(i), p) for i, p in phases if i >= cut_to]
    return head + step_end + moved + after, streams, marks
