"""The allocator with expandable segments, replayed over hand-made traces whose outcome follows
from CUDACachingAllocator.cpp's rules step by step (the numbers in each test's comments)."""

from __future__ import annotations

from trainfit.memory.allocator import replay

MIB = 1 << 20


def _trace(*ops: tuple[str, int] | str) -> list[tuple[int, int]]:
    """``("a", MiB)`` allocates (the allocation's id is its position among the allocations, from
    1), ``"fN"`` frees allocation N."""
    events, sizes = [], {}
    for op in ops:
        if isinstance(op, str):
            uid = int(op[1:])
            events.append((uid, -sizes[uid]))
        else:
            uid = len(sizes) + 1
            sizes[uid] = int(op[1] * MIB)
            events.append((uid, sizes[uid]))
    return events


def test_the_segment_grows_by_whole_pages_from_the_free_block_at_its_end():
    # 1: 30 MiB maps 2 pages of 20 (40 reserved), 10 free at the end; 2: 5 MiB takes it (the only
    # block that fits); 1 freed; 3: 32 MiB fits in no free block: the 5 MiB free at the end
    # (35-40) grows by 27 → 2 pages (80 reserved)
    ev = _trace(("a", 30), ("a", 5), "f1", ("a", 32))
    exp = replay(ev, expandable=True)
    assert exp.peak_reserved_bytes == 80 * MIB
    assert exp.peak_allocated_bytes == 37 * MIB  # 5 + 32, each block split to its own size
    assert exp.segments == 1  # one pool (large), one stream
    # the default allocator: segments of 30, 20 (for the 5) and 32
    assert replay(ev).peak_reserved_bytes == 82 * MIB


def test_a_free_block_at_the_unmapped_edge_is_taken_last():
    # after the steps above: free 0-30 and 67-80.  4: 12 MiB — best fit alone would take 67-80
    # (13), but that block can grow, so it counts as large as the unmapped range: 0-12 is taken.
    # 5: 31 MiB then grows 67-80 by 18 → 1 page (100 reserved).  Had 4 taken 67-79, 5 would have
    # grown 79-80 by 30 → 2 pages (120)
    ev = _trace(("a", 30), ("a", 5), "f1", ("a", 32), ("a", 12), ("a", 31))
    assert replay(ev, expandable=True).peak_reserved_bytes == 100 * MIB


def test_equal_free_blocks_go_lowest_address_first():
    # 1-4: 20 MiB each (4 pages: 80 reserved); 1 and 3 freed: two free 20 MiB blocks, 0-20 and
    # 40-60; 5: 20 MiB takes 0-20, the lower address; 4 freed: 60-80 merges with 40-60; 6: 40 MiB
    # fits at 40-80, nothing mapped (80).  Had 5 taken 40-60, 6 would have found 0-20 and 60-80
    # apart and grown the end by a page (100)
    ev = _trace(("a", 20), ("a", 20), ("a", 20), ("a", 20), "f1", "f3", ("a", 20), "f4",
                ("a", 40))
    rep = replay(ev, expandable=True)
    assert rep.peak_reserved_bytes == 80 * MIB
    assert rep.peak_allocated_bytes == 80 * MIB


def test_pages_split_by_a_live_tensor_are_unmapped_at_the_limit_where_segments_cannot_be():
    # 1: 60 MiB, freed; 2: 2 MiB takes the front of the free 60 (best fit) and splits it; 3: 70 MiB.
    # Default: a new 70 MiB segment (130 > 100); the cache holds no whole free segment (the 60 is
    # split by 2): out of memory.  Expandable: the free 2-60 at the segment's end grows by 12 →
    # one page (80 reserved)
    ev = _trace(("a", 60), "f1", ("a", 2), ("a", 70))
    default = replay(ev, capacity_bytes=100 * MIB)
    assert default.out_of_memory and default.alloc_retries == 1
    exp = replay(ev, capacity_bytes=100 * MIB, expandable=True)
    assert not exp.out_of_memory and exp.alloc_retries == 0
    assert exp.peak_reserved_bytes == 80 * MIB


def test_at_the_limit_free_pages_are_unmapped_and_the_request_retried():
    # capacity 100 MiB.  1: 50 (3 pages: 60 reserved), 2: 4 MiB at 50-54; 1 freed (0-50 free);
    # 3: 70 MiB grows 54-60 by 64 → 4 pages: 140 > 100.  Release: the whole pages of 0-50 (0-40)
    # are unmapped (20 reserved), 40-50 stays; retried: 0-40 unmapped + 40-50 free is 50 < 70, so
    # the end grows again → 100 reserved, the card's limit, after one retry
    ev = _trace(("a", 50), ("a", 4), "f1", ("a", 70))
    rep = replay(ev, capacity_bytes=100 * MIB, expandable=True)
    assert (rep.out_of_memory, rep.alloc_retries) == (False, 1)
    assert rep.peak_reserved_bytes == 100 * MIB
    # one MiB less and it runs out: unmapping cannot free the pages 2 sits in
    short = replay(ev, capacity_bytes=99 * MIB, expandable=True)
    assert short.out_of_memory and short.alloc_retries == 1


def test_a_free_block_keeps_the_part_of_its_first_page_a_live_tensor_shares():
    # 1: 5 MiB (one 20 MiB page), 2: 55 MiB grows the free 5-20 by 2 pages (5-60), 3: 2 MiB at
    # 60-62 (free 62-80); 2 freed: 5-60 free between two live blocks.  4: 70 MiB fits nowhere;
    # the end would grow by 3 pages (140 > 110): release unmaps 20-60 (the whole pages of 5-60)
    # and keeps 5-20 mapped (page 0-20 is shared with 1): 40 reserved; the hole 20-60 with 5-20
    # before it holds 55 < 70, so the end grows (100).  1 freed: 0-5 merges with the kept 5-20
    ev = _trace(("a", 5), ("a", 55), ("a", 2), "f2", ("a", 70), "f1")
    rep = replay(ev, capacity_bytes=110 * MIB, expandable=True)
    assert (rep.out_of_memory, rep.alloc_retries) == (False, 1)
    assert rep.peak_reserved_bytes == 100 * MIB


def test_an_unmapped_hole_is_filled_before_the_end():
    # 1: 40 MiB (2 pages), 2: 40 (2 pages: 80), 3: 0.5 MiB in the small pool (a 2 MiB page: 82);
    # 1 freed (0-40 free).  4: 50 MiB fits in no free block; the end grows by 3 pages → 142.
    ev = _trace(("a", 40), ("a", 40), ("a", 0.5), "f1", ("a", 50), ("a", 30))
    # With room for that, 5: 30 MiB takes the free 0-40: nothing more mapped
    roomy = replay(ev, capacity_bytes=150 * MIB, expandable=True)
    assert (roomy.out_of_memory, roomy.alloc_retries) == (False, 0)
    assert roomy.peak_reserved_bytes == 142 * MIB
    # At 130 MiB, 4 first unmaps the free 0-40 (42 reserved) and grows the end (102).  5 then
    # finds only 130-140 free (10); the lowest place with room is the unmapped hole 0-40, which
    # needs 2 pages (142 > 130) and nothing more can be unmapped: out of memory — although
    # growing the end instead would need one page (122)
    tight = replay(ev, capacity_bytes=130 * MIB, expandable=True)
    assert tight.out_of_memory and tight.alloc_retries == 2
    assert tight.peak_reserved_bytes == 102 * MIB


def test_streams_have_segments_of_their_own():
    ev = _trace(("a", 30), ("a", 30), "f1")
    rep = replay(ev, streams={2: 7}, expandable=True)
    assert rep.segments == 2 and rep.peak_reserved_bytes == 80 * MIB
