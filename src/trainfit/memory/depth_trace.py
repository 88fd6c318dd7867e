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
* the blocks a layer passes on chained: a block the layer frees but did not allocate (the
  previous layer's output, the next layer's input gradient) is, for the second copy on, the
  block the copy before passed out (paired by size and stream, in order), and the block the
  last copy passes out is the one the rest of the step frees.

Replayed through :func:`trainfit.memory.allocator.replay`, the synthesized trace gives the same
reserved and allocated peaks as the trace of the full-depth simulation itself on six of seven
catalog-scale configurations checked (Mistral-7B, Llama-2-7B LoRA, Qwen2.5-7B with 2- and 8-rank
FSDP; exact to the byte), and 224 MiB more on the seventh (Mistral-7B fp32); when the traces do not
differ by repeated runs (anything but insertions, or a passed-on block without a partner) there is
no synthesized trace and the caller keeps its share model.
"""

from __future__ import annotations

import difflib
from collections import defaultdict

Trace = tuple[list[tuple[int, int]], dict[int, int]]
"""(events, streams): (block id, +bytes) allocations and (block id, −bytes) frees in order, and
the stream of each block not on the default one."""

_COPY = 1 << 42
"""Id offset between copies of the inserted layer (block ids are sequence numbers far below it)."""


def _streams_in_order(trace: Trace) -> dict[int, int]:
    """Block id → stream as 1, 2, … by first appearance: the streams are Python objects whose
    ids differ from one simulation to the next; their order of use does not."""
    events, streams = trace
    order: dict[int, int] = {}
    out: dict[int, int] = {}
    for uid, _ in events:
        s = streams.get(uid)
        if s:
            out[uid] = order.setdefault(s, len(order) + 1)
    return out


def deeper_trace(shallow: Trace, deeper: Trace, extra_layers: int) -> Trace | None:
    """The trace of ``deeper``'s depth + ``extra_layers``, or None (see the module docstring).
    ``shallow`` and ``deeper`` must be the same step at depths one or more layers apart."""
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
    events: list[tuple[int, int]] = []
    for tag, _, _, j1, j2 in ops:
        chunk = ev_b[j1:j2]
        if tag == "equal":
            # what the layers pass out is the last copy's
            events += [(u + extra_layers * _COPY if d < 0 and u in alloc_in else u, d)
                       for u, d in chunk]
            continue
        for c in range(extra_layers + 1):
            for u, d in chunk:
                if c and d < 0 and u in passed:
                    events.append((passed[u] + (c - 1) * _COPY, d))
                else:
                    events.append((u + c * _COPY if u in alloc_in else u, d))
    streams = {u: sb[u % _COPY] for u, d in events if d > 0 and u % _COPY in sb}
    return events, streams


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
