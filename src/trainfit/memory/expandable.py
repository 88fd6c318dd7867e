"""The caching allocator with ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``, replayed over
the simulated alloc/free trace (the default allocator: :mod:`trainfit.memory.allocator`).

Rules (c10/cuda/CUDACachingAllocator.cpp, Note [Expandable Segments] and the functions named):
* each pool (small: requests ≤ 1 MiB; large) has one segment per stream: a reserved address
  range of ~1.125 × the card's memory, backed by physical pages mapped on demand — 2 MiB pages
  in the small pool, 20 MiB in the large one (``ExpandableSegment``: ``kSmallBuffer`` /
  ``kLargeBuffer``); reserved bytes are the mapped pages;
* a request (rounded to 512 B) takes the smallest free mapped block of its pool and stream that
  fits, of equal sizes the lowest address (``get_free_block``, ``BlockComparatorSize``; within one
  segment the address is known here: the offset); a free block that ends where the unmapped
  range starts counts as large as it could grow, so it is taken only when no other block fits
  (``expandable_size``);
* otherwise pages are mapped at the lowest address where free and unmapped space together fit
  the request — normally the segment's end, growing the free block there
  (``find_expandable_block``, ``try_allocate_expandable_block``, ``map_block``): the new pages
  are the request less that free block, rounded up to whole pages;
* a block is split whenever the rest is ≥ 512 B, in both pools (``should_split``: the 1 MiB
  floor of the default large pool does not apply);
* freed blocks merge with free mapped neighbours (``try_merge_blocks``: never with unmapped ones);
* at the card's limit (``capacity_bytes``) a mapping that does not fit first unmaps every whole
  free page in every pool, wherever it lies (``release_cached_blocks`` → ``release_blocks`` →
  ``unmap_block``; pages that live tensors only partly cover stay) and retries once
  (``num_alloc_retries``); the holes it leaves are filled before the end
  (``find_expandable_block`` walks the unmapped ranges from the lowest address).
Not modelled: a second segment for a pool (once the address range, 1.125 × the card, is spent:
only after unmapping holes) and ``max_split_size_mb`` / ``garbage_collection_threshold``.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

from trainfit.memory.allocator import (
    EMPTY_CACHE_UID,
    HISTORY_UID,
    K_LARGE_BUFFER,
    K_MIN_BLOCK,
    K_SMALL_BUFFER,
    K_SMALL_SIZE,
    AllocatorReplay,
)

_ADDRESS_SPACE = 1 << 60
"""The segment's address range: unbounded here (1.125 × the card's memory in PyTorch; a request
past it would open a second segment, which is not modelled)."""


@dataclass(eq=False, slots=True)
class _Blk:
    off: int
    size: int
    free: bool = True
    mapped: bool = True
    prev: _Blk | None = None
    next: _Blk | None = None


class _Pool:
    """One stream's small or large pool: its segment's blocks in address order, the free mapped
    ones by (size, address), the unmapped ranges by address."""

    def __init__(self, page: int) -> None:
        self.page = page
        self.free: list[tuple[int, int, _Blk]] = []
        self.unmapped: list[tuple[int, _Blk]] = []
        self._add_unmapped(_Blk(0, _ADDRESS_SPACE, mapped=False))

    def add_free(self, b: _Blk) -> None:
        bisect.insort(self.free, (b.size, b.off, b))

    def remove_free(self, b: _Blk) -> None:
        i = bisect.bisect_left(self.free, (b.size, b.off))
        assert self.free[i][2] is b
        del self.free[i]

    def _add_unmapped(self, b: _Blk) -> None:
        bisect.insort(self.unmapped, (b.off, b))

    def _remove_unmapped(self, b: _Blk) -> None:
        i = bisect.bisect_left(self.unmapped, (b.off,))
        assert self.unmapped[i][1] is b
        del self.unmapped[i]

    def take_free(self, size: int) -> _Blk | None:
        """``get_free_block``: the best fit, a block at the unmapped range's edge last."""
        i = bisect.bisect_left(self.free, (size, -1))
        if i == len(self.free):
            return None
        while i + 1 < len(self.free) and _growable(self.free[i + 1][2]) < _growable(self.free[i][2]):
            i += 1
        return self.free.pop(i)[2]

    def pages(self, size: int) -> int:
        """``size`` rounded up to whole pages (what mapping it takes)."""
        return -(-size // self.page) * self.page

    def _merge(self, dst: _Blk, src: _Blk | None) -> _Blk:
        """``try_merge_blocks``: ``src`` (a neighbour, taken out of its set) into ``dst``."""
        if src is None or not src.free or src.mapped != dst.mapped:
            return dst
        (self.remove_free if src.mapped else self._remove_unmapped)(src)
        if src is dst.prev:
            dst.off = src.off
            dst.prev = src.prev
            if dst.prev is not None:
                dst.prev.next = dst
        else:
            dst.next = src.next
            if dst.next is not None:
                dst.next.prev = dst
        dst.size += src.size
        return dst

    def coalesce(self, b: _Blk) -> _Blk:
        """``b`` merged with its free neighbours of the same kind (mapped or not): the block
        that holds it now."""
        return self._merge(self._merge(b, b.prev), b.next)

    def map(self, b: _Blk, size: int) -> tuple[int, _Blk]:
        """``map_block``: back the first ``size`` bytes of unmapped ``b`` (rounded up to pages)
        and merge them with free mapped neighbours; (the bytes mapped, the free block made)."""
        pages = min(b.size, self.pages(size))
        self._remove_unmapped(b)
        if pages < b.size:
            self._add_unmapped(_split(b, pages, mapped=False))
        b.mapped = True
        b = self.coalesce(b)
        self.add_free(b)
        return pages, b

    def find_space(self, size: int) -> _Blk | None:
        """``find_expandable_block``: the lowest-address run of free and unmapped blocks that
        holds ``size`` (starting at the free block before an unmapped range, if any)."""
        for _, u in self.unmapped:
            c = u.prev if u.prev is not None and u.prev.free else u
            room, b = 0, c
            while room < size and b is not None and b.free:
                room += b.size
                b = b.next
            if room >= size:
                return c
        return None

    def unmap_free(self) -> int:
        """``release_blocks`` / ``unmap_block``: unmap every whole page of every free mapped
        block; the bytes unmapped."""
        released = 0
        for _, _, b in list(self.free):
            first = self.pages(b.off)
            last = (b.off + b.size) // self.page * self.page
            if first >= last:
                continue
            self.remove_free(b)
            if last < b.off + b.size:  # b -> after (mapped, free) -> next?
                self.add_free(_split(b, last - b.off, mapped=True))
            if first > b.off:  # prev? -> before (b, mapped, free) -> the unmapped pages
                pages = _split(b, first - b.off, mapped=False)
                self.add_free(b)
                b = pages
            b.mapped = False
            released += b.size
            self._add_unmapped(self.coalesce(b))
        return released


def env_expandable_segments(env: dict[str, str] | None = None) -> bool:
    """Whether ``env`` (default: this process's) may turn expandable segments on: either
    variable's comma-separated ``key:value`` list (the last ``expandable_segments`` in it) says
    True.  Either counts: torch ≥ 2.9 reads PYTORCH_ALLOC_CONF and falls back to the CUDA name,
    and which one the CUDA allocator honours for this key has changed between releases
    (pytorch/pytorch#183387: the new name ignored for it on CUDA in 2.9.1)."""
    import os

    env = os.environ if env is None else env
    said = []
    for var in ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF"):
        values = [item.partition(":")[2].strip() for item in env.get(var, "").split(",")
                  if item.partition(":")[0].strip() == "expandable_segments"]
        said += values[-1:]
    return "True" in said


def _split(b: _Blk, size: int, mapped: bool) -> _Blk:
    """Cut ``b`` to its first ``size`` bytes; the rest, a free block (``mapped`` or not) linked
    after it, is returned for its set."""
    rest = _Blk(b.off + size, b.size - size, mapped=mapped, prev=b, next=b.next)
    if b.next is not None:
        b.next.prev = rest
    b.next = rest
    b.size = size
    return rest


def _growable(b: _Blk) -> int:
    """``expandable_size``: a free block's size plus the unmapped range right after it."""
    return b.size + (b.next.size if b.next is not None and not b.next.mapped else 0)


def replay_expandable(events: list[tuple[int, int]], streams: dict[int, int] | None = None,
                      capacity_bytes: int | None = None) -> AllocatorReplay:
    """As :func:`trainfit.memory.allocator.replay`, with expandable segments (``segments``: the
    pools' segments, one per pool and stream)."""
    streams = streams or {}
    pools: dict[tuple[bool, int], _Pool] = {}
    live: dict[int, tuple[_Blk, _Pool]] = {}
    reserved = peak_reserved = allocated = peak_allocated = retries = 0

    def grow(pool: _Pool, size: int) -> _Blk | None:
        """``try_allocate_expandable_block``: map pages until a free block holds ``size``;
        None when the card has no room for them (pages mapped before that stay)."""
        nonlocal reserved, peak_reserved
        c = pool.find_space(size)
        while c is not None and (not c.mapped or c.size < size):
            u = c if not c.mapped else c.next
            assert u is not None and not u.mapped
            want = min(u.size, size - (0 if u is c else c.size))
            if capacity_bytes is not None and \
                    reserved + min(u.size, pool.pages(want)) > capacity_bytes:
                return None
            mapped, c = pool.map(u, want)
            reserved += mapped
            peak_reserved = max(peak_reserved, reserved)
        if c is not None:
            pool.remove_free(c)
        return c

    for uid, delta in events:
        if uid == EMPTY_CACHE_UID:  # empty_cache: every free page unmapped, the peak reset
            reserved -= sum(p.unmap_free() for p in pools.values())
            peak_reserved = reserved
            continue
        if delta > 0:
            size = max(K_MIN_BLOCK, -(-delta // K_MIN_BLOCK) * K_MIN_BLOCK)
            small = size <= K_SMALL_SIZE
            key = (small, streams.get(uid, 0))
            pool = pools.get(key)
            if pool is None:
                pool = pools[key] = _Pool(K_SMALL_BUFFER if small else K_LARGE_BUFFER)
            blk = pool.take_free(size)
            if blk is None:
                blk = grow(pool, size)
                if blk is None and capacity_bytes is not None:
                    retries += 1
                    reserved -= sum(p.unmap_free() for p in pools.values())
                    blk = grow(pool, size)
                if blk is None:
                    return AllocatorReplay(peak_reserved, peak_allocated, len(pools), retries, True)
            if blk.size - size >= K_MIN_BLOCK:  # should_split: the low part is handed out
                pool.add_free(_split(blk, size, mapped=True))
            blk.free = False
            live[uid] = (blk, pool)
            if uid < HISTORY_UID:
                allocated += blk.size
                peak_allocated = max(peak_allocated, allocated)
        else:
            got = live.pop(uid, None)
            if got is None:
                continue
            blk, pool = got
            if uid < HISTORY_UID:
                allocated -= blk.size
            blk.free = True
            pool.add_free(pool.coalesce(blk))
    return AllocatorReplay(peak_reserved, peak_allocated, len(pools), retries)


SAVING_NOTE_MIN_BYTES = 256 * 2**20
SAVING_NOTE_MIN_FRACTION = 0.02
"""plan names the setting where it lowers the step's reserve by at least this much (both): the
replay came within 0.1 GiB of the reserve an H200 measured with the setting on 8 of 9 steps
(benchmarks/results/gpu_validate_h200.md), so a smaller saving is not told apart."""


def saving_note(reserved: int, with_expandable: int) -> str:
    """What a plan made with default segments says when expandable ones reserve clearly less."""
    saved = reserved - with_expandable
    if saved < max(SAVING_NOTE_MIN_BYTES, SAVING_NOTE_MIN_FRACTION * reserved):
        return ""
    return (f"with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (--expandable-segments) the "
            f"step would reserve {with_expandable / 2**30:.2f} GiB instead of "
            f"{reserved / 2**30:.2f} (predicted, {saved / 2**30:.2f} GiB less: the free ends of "
            "default segments are not kept; on an H200 this replay came within 0.1 GiB of the "
            "measured reserve on 8 of 9 steps, benchmarks/results/gpu_validate_h200.md)")
