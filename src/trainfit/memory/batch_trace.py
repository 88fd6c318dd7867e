"""A step's alloc/free trace across micro-batches: interpolated between two simulated
micro-batches (:func:`batch_trace`, :func:`trace_at`), and cut from a step of two micro-steps to
one (:func:`one_micro_step_trace`).  Its depth is :mod:`trainfit.memory.depth_trace`'s concern."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from trainfit.memory.depth_trace import Trace


def streams_in_order(trace: Trace) -> dict[int, int]:
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
    if len(ev_lo) != len(ev_hi) or streams_in_order(lo) != streams_in_order(hi):
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
