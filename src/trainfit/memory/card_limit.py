"""The step's reserve where the card or the allocator setting decides it: the rank's reserve
composed from the one-process allocator replay, the replay again at the card's limit (the real
allocator releases its cache, or unmaps free pages, and retries), and the same step's reserve
with expandable segments for a plan made without them.  Used by
:func:`trainfit.memory.predict.finish`."""

from __future__ import annotations

from collections.abc import Callable

from trainfit.memory.allocator import replay
from trainfit.memory.depth_trace import Trace
from trainfit.memory.expandable import saving_note


def held_reserve(allocated: int, replay_reserved_bytes: int, tensor_peak_bytes: int) -> int:
    """The rank's reserve: its allocated peak + what the allocator replay reserved above the
    one-process trace's own tensors (the other ranks' shards change the size of persistent
    blocks, not the step's churn)."""
    return allocated + max(0, replay_reserved_bytes - tensor_peak_bytes)


def expandable_reserve(trace: Trace | Callable[[], Trace | None] | None, room: int | None,
                       allocated: int, tensor_peak_bytes: int, reserved: int,
                       make_trace: bool = False) -> tuple[int | None, str]:
    """(reserve, note) of the same step with expandable segments, for a plan made without them,
    on a card the live bytes fit (past it, no allocator setting helps); the note where the saving
    is clear (:func:`trainfit.memory.expandable.saving_note`).  An extrapolated row's full-depth
    trace is made on demand (a callable) and only with ``make_trace``: the plan asks it for its
    ▲ rows, not for every row (a catalog-scale trace holds tens of thousands of events).  The
    default replay's tensor peak is never below this one's (it splits off every remainder), so
    the figure errs high, not low."""
    if room is not None and allocated > room:
        return None, ""
    if callable(trace) and make_trace:
        trace = trace()
    if not isinstance(trace, tuple):
        return None, ""
    rep = replay(trace[0], trace[1], expandable=True)
    held = held_reserve(allocated, rep.peak_reserved_bytes, tensor_peak_bytes)
    return held, saving_note(reserved, held)


def at_card_limit(trace: Trace | Callable[[], Trace | None], room_bytes: int, allocated: int,
                  tensor_peak_bytes: int, reserved: int, expandable: bool = False
                  ) -> tuple[int, int, str]:
    """(reserved, retries, note) once the card is taken into account; ``room_bytes`` is what
    cudaMalloc can still get.  The real allocator does not grow past the card: it releases its
    cached segments (with ``expandable``: unmaps its free pages) and retries
    (CUDACachingAllocator.cpp), so the run goes on while the allocated bytes and the blocks it
    cannot release fit — otherwise it is out of memory, and the reserve the step asks for
    stands."""
    if reserved <= room_bytes or allocated > room_bytes:
        return reserved, 0, ""  # room enough, or the live bytes alone pass the card: no replay
    if callable(trace):  # an extrapolated row's full-depth trace, made only when needed
        trace = trace()
        if trace is None:
            return reserved, 0, ""
    # the trace is the one-process step's: the rank's other allocations take their room first
    capacity = room_bytes - (allocated - tensor_peak_bytes)
    capped = replay(trace[0], trace[1], capacity_bytes=capacity, expandable=expandable)
    if capped.out_of_memory:
        # measured on a held-out trace (Mistral-7B QLoRA, benchmarks/results/heldout_memory.md):
        # the replay ran out at 23.5-25.5 GiB but not at 23.0 or 25.75 — which moment the cache
        # is released decides what is split later, so the verdict is not monotonic in capacity
        head = (f"at the card's limit: the allocated peak fits ({allocated / 2**30:.2f} GiB) but, "
                "replayed at this capacity, the allocator runs out even after ")
        tail = ("; that outcome turns on the exact order of allocations, a few hundred MiB of "
                "capacity either way can reverse it: called not fitting — `trainfit tune` on the "
                "card measures it")
        if expandable:
            return reserved, 0, head + (
                "unmapping every free page (expandable segments: the pages live tensors partly "
                "cover stay mapped)") + tail
        alt = replay(trace[0], trace[1], capacity_bytes=capacity, expandable=True)
        alt_held = held_reserve(allocated, alt.peak_reserved_bytes, tensor_peak_bytes)
        return reserved, 0, head + (
            "releasing its cache (segments split by live tensors cannot be returned)") + tail + (
            "; with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (--expandable-segments) "
            "the allocator can unmap the free pages of those segments: " + (
                "replayed so, it runs out too" if alt.out_of_memory else
                f"replayed so, the step runs, reserving {alt_held / 2**30:.2f} GiB (predicted, "
                f"{alt.alloc_retries} release(s) a step)") +
            " (torch ≥ 2.9 calls that name deprecated, but its new name PYTORCH_ALLOC_CONF was "
            "ignored for this setting on CUDA in 2.9.1: pytorch/pytorch#183387)")
    held = held_reserve(allocated, capped.peak_reserved_bytes, tensor_peak_bytes)
    return held, capped.alloc_retries, (
        f"at the card's limit: the step would reserve {reserved / 2**30:.2f} GiB; the allocator "
        f"{'unmaps its free pages' if expandable else 'releases its cached blocks'} and retries "
        f"{capped.alloc_retries}× a step (num_alloc_retries), so reserved stays at "
        f"{held / 2**30:.2f} GiB — each release synchronizes the GPU and re-allocates: the step "
        "is slower than a step with room (how much is not modelled)")
