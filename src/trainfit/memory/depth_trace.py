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
* the blocks a layer passes on chained (:func:`_chains`): a block made on one side of a run's
  boundary and freed on the other (the previous layer's output, what the forward saved for the
  backward) is taken by the frees of its chain in the order the deeper trace's frees take them,
  an inserted allocation standing for all its copies (a queue, a stack, or a rotation of one).

Replayed through :func:`trainfit.memory.allocator.replay`, the synthesized trace gives the
allocated peak and the reserve of the full-depth simulation itself, to the byte, and frees the
same blocks at the same moments (but for one per-step block of a few hundred bytes whose size
grows with the depth: where it crosses a 512-byte block between the two depths, the alignment
resizes it and the synthesized trace grows it per run, :func:`_grown_block` — Gemma-3's sixes),
on every catalog-scale configuration checked: Mistral-7B bf16-true 1×1,
1×2, 4×1, amp-bf16 1×2, 2×2, checkpointed 2×1, 12×1, 1×2 and 2×2, amp-fp16 8×1; Llama-2-7B
LoRA 1×1; Llama-3.2-1B bf16-true 1×1, 2×1, amp-bf16 checkpointed 1×2, 2×2; Qwen2.5-7B 8-rank
FSDP bf16-true 2×2.  Pairing each run's frees with the copy run before instead read those
reserves up to 224 MiB over and 176 MiB under (Mistral-7B bf16-true 1×1: 1,052 MiB against
1,228).  Each inserted run is first moved to a middle layer (:func:`_centred`): the last layer's
differs.  When the traces do not differ by repeated runs (anything but insertions), or a chain's
frees take its blocks in an order the shallow trace contradicts, there is no synthesized trace
and the caller keeps its share model.
"""

from __future__ import annotations

import bisect
import dataclasses
import math
from collections import deque
from dataclasses import dataclass
from typing import Any

from trainfit.memory.batch_trace import streams_in_order, trace_at
from trainfit.memory.trace_align import TraceMatcher

Trace = tuple[Any, ...]
"""(events, streams[, phases]): (block id, +bytes) allocations and (block id, −bytes) frees in
order; the stream of each block not on the default one; and (event index, phase) where each
phase begins (``LiveBytesTracker.event_phases``; without it every layer run is taken to go in
the forward order)."""


_COPY = 1 << 42
"""Id offset between copies of the inserted layer (block ids are sequence numbers far below it)."""


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
    chains: dict[int, int]
    """Event index of a free of a block a layer passes on → its chain (see :func:`_chains`)."""
    takes: dict[int, list[tuple[int, bool]]]
    """Chain → the allocations its frees take, in order, an inserted one standing for its
    copies, with whether those go last copy first (:func:`_takes`)."""
    backward: Any
    """Event index → whether it falls in the backward."""
    grown: dict[int, int] = dataclasses.field(default_factory=dict)
    """Block id (deeper trace) → the bytes it grows by per inserted run, at most: a block of one
    value per tensor (:func:`_grown_block`), made at each depth at that depth's size."""


def _makers(events: list[tuple[int, int]]) -> list[int | None]:
    """Event index → for a free, the index of its block's allocation (None: made before the
    trace began, or the event is an allocation)."""
    at: dict[int, int] = {}
    out: list[int | None] = []
    for j, (u, d) in enumerate(events):
        if d > 0:
            at[u] = j
        out.append(None if d > 0 else at.get(u))
    return out


class _Sets:
    """Union-find over event indices (the chains)."""

    def __init__(self) -> None:
        self.up: dict[int, int] = {}

    def find(self, x: int) -> int:
        self.up.setdefault(x, x)
        while self.up[x] != x:
            self.up[x] = self.up[self.up[x]]
            x = self.up[x]
        return x

    def join(self, a: int, b: int) -> None:
        self.up[self.find(a)] = self.find(b)


def _takes(sites: list[int]) -> list[tuple[int, bool]]:
    """A chain's allocations (``sites``: their indices, in the order the deeper trace's frees
    take them), each with whether its copies, where it is an inserted one, are taken last copy
    first.  They go the way the frees go around it: against the step's order where the
    allocation taken just before it was made after it (for the first: the one taken just after
    it was made before it): a stack's frees take the deepest layer's block first."""
    return [(s, sites[k - 1] > s if k else len(sites) > 1 and sites[1] < s)
            for k, s in enumerate(sites)]


def _chains(shallow: Trace, deeper: Trace, inside: list[bool],
            ops: list[tuple[str, int, int, int, int]]
            ) -> tuple[dict[int, int], dict[int, list[tuple[int, bool]]]] | None:
    """The chains of passed-on blocks: each free's event index (deeper) → its chain, and each
    chain → the allocations its frees take, in order (:func:`_takes`).

    A layer passes blocks on: its output is freed by a later layer, what its forward saved by
    its backward.  Where the inserted run does not begin at a layer's boundary (the alignment
    picks one rotation of the repeated events) a block can be freed one layer or two after the
    one that made it: Mistral-7B bf16-true, 512 tokens, one micro-step: the hidden state a run
    makes last is freed two runs on, so the block made just before the first run is freed by
    the second copy (pairing each run's free with the copy before it left every size right but
    read the reserve 156 MiB under the full-depth simulation at micro-batch 1).  Which blocks a
    chain holds is read from both traces: in the deeper one, each free of a block made on the
    other side of a run's boundary; in the shallow one, each free outside the runs that takes
    another block than its counterpart in the deeper trace.  The order in which the deeper
    trace's frees take the chain's allocations, with each inserted allocation standing for all
    its copies, is the order at any depth: a queue (a layer's output, freed by the layers
    after), a stack (what the forward saved, freed by the backward deepest layer first), or
    neither (the block made after a loop freed first, then the loop's in order: Llama-3.2-1B
    amp-bf16 checkpointed).  It must also give the shallow trace's own pairs; None when not."""
    ev = deeper[0]
    maker = _makers(ev)
    to_deep = {i1 + k: j1 + k for tag, i1, i2, j1, _ in ops if tag == "equal"
               for k in range(i2 - i1)}
    sets = _Sets()
    for j, p in enumerate(maker):
        if p is not None and inside[j] != inside[p]:
            sets.join(j, p)
    low_pairs: dict[int, int] = {}
    for i, p in enumerate(_makers(shallow[0])):
        if shallow[0][i][1] > 0:
            continue
        j = to_deep[i]
        if (p is None) != (maker[j] is None):
            return None  # one frees a block made before the trace began, the other not
        if p is not None:
            low_pairs[j] = to_deep[p]
            if maker[j] != to_deep[p]:
                sets.join(j, to_deep[p])
                sets.join(j, maker[j])
    chain = {j: sets.find(j) for j in sets.up if ev[j][1] < 0}
    takes: dict[int, list[tuple[int, bool]]] = {}
    for c in set(chain.values()):
        frees = sorted(j for j in chain if chain[j] == c)
        takes[c] = _takes([maker[j] for j in frees])
        kept = [s for s, _ in takes[c] if not inside[s]]
        low = [j for j in frees if not inside[j]]
        if [low_pairs[j] for j in low] != kept[:len(low)]:
            return None
    return chain, takes


def _centred(ops: list[tuple[str, int, int, int, int]], tb: list[Any]
             ) -> list[tuple[str, int, int, int, int]]:
    """Each inserted run moved, where it can be, to where the deeper trace has a copy of it on
    each side: a layer in the middle of the stack.  The alignment may insert the last layer's
    run (or the first's), and the last layer differs from the others: the accumulating
    checkpointed amp step keeps its output until the backward, where every other layer's dies
    in the next layer's forward; repeated, that run had no order its chains could follow
    (Mistral-7B amp-bf16 checkpointed 2×2: no trace; from a middle layer's run, the 32-layer
    simulation's reserve to the byte).  A run moves by ``d`` events only where the events it
    leaves behind equal those it takes on (another rotation of the same insertion)."""
    out = [list(o) for o in ops]
    for k, (tag, _, _, j1, j2) in enumerate(ops):
        if tag != "insert" or not 0 < k < len(ops) - 1 or \
                out[k - 1][0] != "equal" or out[k + 1][0] != "equal":
            continue
        room = (out[k - 1][3], out[k + 1][4])
        d = min((d for d in range(j1 - j2, j2 - j1 + 1) if _surrounded(tb, j1, j2, d, room)),
                key=abs, default=0)
        if d:
            out[k - 1][2] += d
            out[k - 1][4] += d
            out[k][1:] = [x + d for x in out[k][1:]]
            out[k + 1][1] += d
            out[k + 1][3] += d
    return [(t, a, b, c, e) for t, a, b, c, e in out]


def _surrounded(tb: list[Any], j1: int, j2: int, d: int, room: tuple[int, int]) -> bool:
    """Whether the inserted run ``tb[j1:j2]`` moved by ``d`` events is another rotation of the
    same insertion (the events it leaves behind equal those it takes on) with a copy of itself
    on each side, inside ``room`` (the first event of the equal run before it, the end of the
    one after)."""
    n, a, b = j2 - j1, j1 + d, j2 + d
    if a - n < room[0] or b + n > room[1]:
        return False
    same = tb[j1:j1 + d] == tb[j2:j2 + d] if d > 0 else tb[j1 + d:j1] == tb[j2 + d:j2]
    return same and tb[a - n:a] == tb[a:b] == tb[b:b + n]


def _split_junctions(ops: list[tuple[str, int, int, int, int]], ta: list[Any], tb: list[Any]
                     ) -> list[tuple[str, int, int, int, int]]:
    """Each inserted run A + B that sits where the shallow trace has A A before and B B after
    split in two (A repeated, then B repeated).  One foreach op over every layer's tensors makes
    them all, then frees them all: the shallow trace holds two layers' allocations then two
    layers' frees, and the alignment may insert the third layer's at the junction as one run;
    repeated whole it would alternate one layer's allocations and frees (Mistral-7B AdamW's
    per-tensor scalars: 676 events in another order than the 32-layer simulation's).  A
    layer's own run A B rotated to a junction has B A, not A A, before it.  Nor is a run A A
    split: two layers alike inserted together (a repeat of Gemma-2's sliding and global layers,
    whose events are the same) are a layer passing its output to the next, and split, each
    half's copies would run apart (no trace: the second half's first copy frees the output the
    first half's last copy made)."""
    out: list[tuple[str, int, int, int, int]] = []
    for tag, i1, i2, j1, j2 in ops:
        run = tb[j1:j2]
        cut = next((k for k in range(1, len(run)) if tag == "insert" and run[:k] != run[k:]
                    and ta[max(0, i1 - 2 * k):i1] == run[:k] * 2
                    and ta[i1:i1 + 2 * (len(run) - k)] == run[k:] * 2), None)
        if cut is None:
            out.append((tag, i1, i2, j1, j2))
        else:
            out += [("insert", i1, i1, j1, j1 + cut), ("insert", i1, i1, j1 + cut, j2)]
    return out


GROWN_MAX_BYTES = 64 * 1024
"""The largest block :func:`_grown_block` takes for one whose size grows with the depth: a list
of one scalar per tensor (tens of thousands of tensors at 4 bytes), never an activation."""
GROWN_BLOCKS = 4
"""How many such blocks one alignment may resize before it gives up (a Gemma-3 step has one)."""


def _grown_block(ops: list[tuple[str, int, int, int, int]], k: int, shallow: Trace,
                 ta: list[Any], tb: list[Any]) -> tuple[int, int] | None:
    """(block id in ``shallow``, its size in the deeper trace) for a block the two traces make
    at different sizes, found where the alignment could not match (``ops[k]``, a delete or a
    replace): a list of one value per tensor grows with the depth, and crosses a 512-byte
    block boundary between some depths — clip_grad_norm's stacked per-tensor norms, 4 bytes a
    tensor: 1,024 bytes at Gemma-3's 14 layers (13 tensors each), 1,536 at 20.  The shallow
    trace's first unmatched event names the block; the deeper trace's allocations there and in
    the replaced runs up to two opcodes on either side (the block's allocation and its free come
    apart, with an event that did match between them; an inserted run is a layer's, not this
    block's) must offer one larger size (≤ :data:`GROWN_MAX_BYTES`) on
    the same stream, or None."""
    _, i1, _, _, _ = ops[k]
    uid = shallow[0][i1][0]
    _, size, stream = ta[i1]
    near = [j for tag, _, _, j1, j2 in ops[max(0, k - 2):k + 3]
            if tag in ("delete", "replace") for j in range(j1, j2)]
    sizes = {tb[j][1] for j in near
             if tb[j][0] and tb[j][2] == stream and size < tb[j][1] <= GROWN_MAX_BYTES}
    if len(sizes) != 1 or size > GROWN_MAX_BYTES:
        return None
    return uid, sizes.pop()


def layer_runs(shallow: Trace, deeper: Trace) -> LayerRuns | None:
    """The repeated runs between ``shallow`` and ``deeper`` (the same step at depths one or more
    layers apart), or None when they differ by anything but insertions (and blocks whose size
    grows with the depth, :func:`_grown_block`) or the blocks a layer passes on do not chain
    (see :func:`_chains`)."""
    sa, sb = streams_in_order(shallow), streams_in_order(deeper)
    ev_b = deeper[0]
    resized: dict[int, int] = {}  # shallow block id → its size in the deeper trace
    tb = [(d > 0, abs(d), sb.get(u, 0)) for u, d in ev_b]
    for _ in range(GROWN_BLOCKS + 1):
        ta = [(d > 0, resized.get(u, abs(d)), sa.get(u, 0)) for u, d in shallow[0]]
        ops = TraceMatcher(ta, tb).get_opcodes()
        bad = next((k for k, (tag, *_) in enumerate(ops) if tag not in ("equal", "insert")),
                   None)
        if bad is None:
            break
        got = _grown_block(ops, bad, shallow, ta, tb)
        if got is None or got[0] in resized:
            return None
        resized[got[0]] = got[1]
    else:
        return None
    ops = _split_junctions(_centred(ops, tb), ta, tb)
    inside = [False] * len(ev_b)
    for tag, _, _, j1, j2 in ops:
        if tag == "insert":
            inside[j1:j2] = [True] * (j2 - j1)
    got = _chains(shallow, deeper, inside, ops)
    if got is None:
        return None
    backward = _backward(deeper)
    made = {u: backward(j) for j, (u, d) in enumerate(ev_b) if d > 0 and inside[j]}
    # each resized block's id in the deeper trace (its allocation's counterpart), and its growth
    # per run: the two sizes are rounded up to 512-byte blocks, so the bytes it grows by per run
    # are less than their difference + 512 — that bound, never smaller than the step's block
    grown = {ev_b[j1 + i - i1][0]: resized[u] - d + 512
             for tag, i1, i2, j1, _ in ops if tag == "equal"
             for i in range(i1, i2) if (u := shallow[0][i][0]) in resized
             and (d := shallow[0][i][1]) > 0}
    if len(grown) != len(resized):
        return None  # a resized block whose allocation went unmatched
    return LayerRuns(ops, ev_b, sb, made, *got, backward, grown)


def deeper_trace(shallow: Trace, deeper: Trace, extra_runs: int, sized: Trace | None = None,
                 runs: LayerRuns | None = None) -> Trace | None:
    """The trace of ``deeper`` with ``extra_runs`` more copies of what it has beyond ``shallow``,
    or None (see the module docstring).  ``shallow`` and ``deeper`` must be the same step at
    depths one layer, or one repeat of the stack's pattern, apart (``runs``: their
    :func:`layer_runs`, when already made).

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
    # frees copy c's.  A free of a passed-on block (a chain's) takes its block from the chain
    # when the whole trace is laid out (below).
    last = extra_runs
    events: list[tuple[int, int]] = []
    site: list[int] = []  # each event's index in the deeper trace
    for tag, _, _, j1, j2 in r.ops:
        if tag == "equal":
            events += [r.events[j] for j in range(j1, j2)]
            site += range(j1, j2)
            continue
        rev = r.backward(j1)
        for c in range(extra_runs + 1):
            for j in range(j1, j2):
                u, d = r.events[j]
                if d > 0 and u in r.made_inside:
                    u += c * _COPY
                elif d < 0 and u in r.made_inside:  # made and freed by runs: no chain's
                    u += (last - c if r.made_inside[u] != rev else c) * _COPY
                events.append((u, d))
                site.append(j)
    queue = {c: deque(r.events[s][0] + k * _COPY
                      for s, rev in order
                      for k in (range(last, -1, -1) if rev else range(last + 1))
                      if k == 0 or r.events[s][0] in r.made_inside)
             for c, order in r.takes.items()}
    live: set[int] = set()
    out: list[tuple[int, int]] = []
    for (u, d), j in zip(events, site, strict=True):
        if d < 0 and j in r.chains:
            taken = queue[r.chains[j]]
            if not taken or taken[0] not in live:
                return None  # the chain's next block is not made yet: not this order
            u = taken.popleft()
        if d > 0:
            live.add(u)
        else:
            live.discard(u)
        grow = r.grown.get(r.events[j][0], 0) * extra_runs
        # signed: an allocation's bytes, or a free's negated; a block of one value per tensor
        # grown by its growth per run (a bound: never smaller than the step's own)
        out.append((u, size[j] + (grow if size[j] > 0 else -grow)))
    sb = r.streams
    streams = {u: sb[u % _COPY] for u, d in out if d > 0 and u % _COPY in sb}
    return out, streams  # no phases: a synthesized trace is replayed, not extended again


ALIGN_AT = 1 / math.sqrt(2)
"""Where between two traced micro-batches the traces are aligned (:func:`~trainfit.memory.
batch_trace.batch_trace` at
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
    # the inserted run is the layers the two depths differ by: one, or a repeat of the stack's
    # pattern (Gemma-2's sliding + global pair, trainfit.model.depth); copied once per repeat
    span = depths[1] - depths[0]
    if extra % span:
        return None
    trace = None if aligned is None or batch < 2 else \
        deeper_trace(lo, hi, extra // span, sized=hi, runs=aligned)
    if trace is None:
        trace = deeper_trace(lo, hi, extra // span)
    if trace is None:
        return None
    bad_hi = malformed(hi[0])
    per_layer = (bad_hi - malformed(lo[0])) / (depths[1] - depths[0])
    return trace if malformed(trace[0]) == round(bad_hi + extra * per_layer) else None
