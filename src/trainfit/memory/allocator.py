"""A model of PyTorch's CUDA caching allocator, replayed over the simulated allocation trace.

``reserved`` (``torch.cuda.max_memory_reserved``) exceeds ``allocated`` because the allocator
carves blocks out of cudaMalloc'ed segments and never returns them: a free block that no request
fits stays reserved.  Replaying the exact alloc/free sequence of the step through the allocator's
rules predicts that gap mechanistically instead of adding a flat percentage.

Rules (c10/cuda/CUDACachingAllocator.cpp, defaults, no ``PYTORCH_CUDA_ALLOC_CONF``):
* sizes are rounded up to 512 B (``kMinBlockSize``);
* requests ≤ 1 MiB (``kSmallSize``) use the small pool, larger ones the large pool;
* a new segment is 2 MiB for small requests (``kSmallBuffer``), 20 MiB for requests < 10 MiB
  (``kLargeBuffer``/``kMinLargeAlloc``), else the request rounded up to 2 MiB (``kRoundLarge``);
* a request takes the smallest free block of its pool that fits (best fit); of free blocks of
  one size, the one that entered the pool first (the allocator's ``BlockComparatorSize`` takes
  the lowest address, which is not known here: docs/memory-model.md §4 says what trying it gave);
* a block is split when the remainder is ≥ 512 B (small pool) or > 1 MiB (large pool);
* freed blocks merge with free neighbours in the same segment; segments are never released;
* a free block is reused only by a request on the stream it was allocated on (``get_free_block``
  searches the pool for the request's stream): FSDP's all-gather and reduce-scatter buffers,
  made on streams of their own, never take the default stream's blocks nor leave holes in them.
* at the card's limit (``capacity_bytes``: what cudaMalloc can still get), a request that needs
  a new segment first releases every cached free block that is a whole segment, in every pool,
  and retries (``release_cached_blocks`` then ``alloc_block(..., isRetry=true)``, counted in
  ``num_alloc_retries``; ``release_available_cached_blocks`` is skipped: it acts only with
  ``max_split_size_mb`` set); if the segment still does not fit, the step runs out of memory.
* blocks with ids ≥ :data:`HISTORY_UID` were made and freed before the step (FSDP1's wrapping,
  :mod:`trainfit.memory.wrap`): they take and leave segments like any other, but the step's
  ``max_memory_allocated`` is measured after ``reset_peak_memory_stats``, so they never count in
  the allocated bytes (a reserve kept from before the reset is what ``max_memory_reserved`` then
  starts from).
With ``expandable_segments:True`` the rules differ: :mod:`trainfit.memory.expandable`.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from dataclasses import dataclass

K_MIN_BLOCK = 512
"""c10/cuda/CUDACachingAllocator.cpp ``kMinBlockSize``: every block is a multiple of 512 bytes."""
K_SMALL_SIZE = 1 << 20
K_SMALL_BUFFER = 2 << 20
K_LARGE_BUFFER = 20 << 20
K_MIN_LARGE_ALLOC = 10 << 20
K_ROUND_LARGE = 2 << 20
HISTORY_UID = 1 << 52
"""Block ids from here on are the history before the step (see the module docstring); far above
the trace's sequence numbers and the layer copies' offsets of :mod:`trainfit.memory.depth_trace`
(2^42 per copy)."""
EMPTY_CACHE_UID = 1 << 60
"""The event ``(EMPTY_CACHE_UID, 0)``: ``torch.cuda.empty_cache()`` then
``reset_peak_memory_stats()`` — every cached free block that is a whole segment is given back
(``release_cached_blocks``, as at the card's limit; a segment a live tensor splits stays), and
the reserved peak restarts from what is left (torchtune's ``cleanup_before_training``)."""


@dataclass
class _Blk:
    seg: int
    offset: int
    size: int
    free: bool
    prev: _Blk | None = None
    next: _Blk | None = None


def _round(size: int) -> int:
    return max(K_MIN_BLOCK, (size + K_MIN_BLOCK - 1) // K_MIN_BLOCK * K_MIN_BLOCK)


def _segment_size(size: int) -> int:
    if size <= K_SMALL_SIZE:
        return K_SMALL_BUFFER
    if size < K_MIN_LARGE_ALLOC:
        return K_LARGE_BUFFER
    return (size + K_ROUND_LARGE - 1) // K_ROUND_LARGE * K_ROUND_LARGE


@dataclass
class AllocatorReplay:
    peak_reserved_bytes: int
    peak_allocated_bytes: int
    segments: int
    alloc_retries: int = 0
    """Requests that released the cache and retried at ``capacity_bytes`` (num_alloc_retries)."""
    out_of_memory: bool = False
    """A segment did not fit under ``capacity_bytes`` even with the cache released: the replay
    stopped there (the peaks are those reached before)."""


def _release_cached_blocks(pools: dict[tuple[bool, int], list[tuple[int, int, _Blk]]]) -> int:
    """``release_cached_blocks``: drop every free block that is a whole segment (nothing else
    lives in it), in every pool; the bytes given back to the driver."""
    released = 0
    for k, entries in pools.items():
        keep = [e for e in entries if e[2].prev is not None or e[2].next is not None]
        released += sum(e[2].size for e in entries) - sum(e[2].size for e in keep)
        pools[k] = keep
    return released


def replay(events: list[tuple[int, int]], streams: dict[int, int] | None = None,
           capacity_bytes: int | None = None, expandable: bool = False) -> AllocatorReplay:
    """``events``: (uid, +bytes) for an allocation, (uid, -bytes) for its free; ``streams``: the
    stream of the allocations not made on the default stream (uid → stream); ``capacity_bytes``:
    the most the segments may total (None: unbounded, the reserve the trace asks for);
    ``expandable``: the allocator with ``expandable_segments:True``
    (:mod:`trainfit.memory.expandable`)."""
    if expandable:
        # imported here: that module builds on this one's constants and result type
        from trainfit.memory.expandable import replay_expandable

        return replay_expandable(events, streams, capacity_bytes)
    streams = streams or {}
    retries = 0
    pools: dict[tuple[bool, int], list[tuple[int, int, _Blk]]] = {}  # (small?, stream) → sorted
    live: dict[int, _Blk] = {}
    reserved = peak_reserved = allocated = peak_allocated = 0
    nseg = 0
    counter = 0

    def add_free(b: _Blk, key: tuple[bool, int]) -> None:
        nonlocal counter
        counter += 1
        bisect.insort(pools.setdefault(key, []), (b.size, counter, b))

    def remove_free(b: _Blk, key: tuple[bool, int]) -> None:
        pool = pools[key]
        for i in range(bisect.bisect_left(pool, (b.size, -1)), len(pool)):
            if pool[i][2] is b:
                del pool[i]
                return

    key_of: dict[int, tuple[bool, int]] = {}  # segment → its pool
    for uid, delta in events:
        if uid == EMPTY_CACHE_UID:
            reserved -= _release_cached_blocks(pools)
            peak_reserved = reserved
            continue
        if delta > 0:
            size = _round(delta)
            small = size <= K_SMALL_SIZE
            key = (small, streams.get(uid, 0))
            pool = pools.setdefault(key, [])
            i = bisect.bisect_left(pool, (size, -1))
            if i < len(pool):
                blk = pool.pop(i)[2]
            else:
                seg = _segment_size(size)
                if capacity_bytes is not None and reserved + seg > capacity_bytes:
                    retries += 1
                    reserved -= _release_cached_blocks(pools)
                    if reserved + seg > capacity_bytes:
                        return AllocatorReplay(peak_reserved, peak_allocated, nseg, retries, True)
                nseg += 1
                reserved += seg
                peak_reserved = max(peak_reserved, reserved)
                blk = _Blk(nseg, 0, seg, True)
                key_of[nseg] = key
            remaining = blk.size - size
            if (small and remaining >= K_MIN_BLOCK) or (not small and remaining > K_SMALL_SIZE):
                rest = _Blk(blk.seg, blk.offset + size, remaining, True, prev=blk, next=blk.next)
                if blk.next is not None:
                    blk.next.prev = rest
                blk.next = rest
                blk.size = size
                add_free(rest, key)
            blk.free = False
            live[uid] = blk
            if uid < HISTORY_UID:
                allocated += blk.size
                peak_allocated = max(peak_allocated, allocated)
        else:
            blk = live.pop(uid, None)
            if blk is None:
                continue
            key = key_of[blk.seg]
            if uid < HISTORY_UID:
                allocated -= blk.size
            add_free(_coalesce(blk, remove_free, key), key)
    return AllocatorReplay(peak_reserved, peak_allocated, nseg, retries)


def _coalesce(blk: _Blk, unpool: Callable[[_Blk, tuple[bool, int]], None],
              key: tuple[bool, int]) -> _Blk:
    """``blk`` freed and merged with its free neighbours in the segment (each taken out of its
    pool ``key`` by ``unpool``), as ``free_block`` does (CUDACachingAllocator.cpp,
    try_merge_blocks)."""
    blk.free = True
    for nb in (blk.prev, blk.next):
        if nb is not None and nb.free:
            unpool(nb, key)
            if nb is blk.prev:
                nb.size += blk.size
                nb.next = blk.next
                if blk.next is not None:
                    blk.next.prev = nb
                blk = nb
            else:
                blk.size += nb.size
                blk.next = nb.next
                if nb.next is not None:
                    nb.next.prev = blk
    return blk


def reserve_after_history(events: list[tuple[int, int]], streams: dict[int, int],
                          end: int | None = None, expandable: bool = False
                          ) -> tuple[int, int] | None:
    """(reserved, allocated) bytes after the first ``end`` events, by default where the history
    before the step ends (FSDP1's wrap: Answer.AI's ``reserved_after_model_wrap`` /
    ``allocated_after_model_wrap``); None without one."""
    if end is None:  # the emptying of the cache, if any, belongs to the history
        end = 1 + max((i for i, (u, _) in enumerate(events) if u >= HISTORY_UID), default=-1)
    if end <= 0:
        return None
    rep = replay(events[:end], streams, expandable=expandable)
    return rep.peak_reserved_bytes, sum(d for u, d in events[:end] if u < HISTORY_UID)
