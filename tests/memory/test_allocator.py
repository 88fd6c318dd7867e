from trainfit.memory.allocator import replay

MIB = 2**20


def test_small_blocks_share_a_2mib_segment():
    r = replay([(1, 1000), (2, 1000), (3, 512)])
    assert r.peak_reserved_bytes == 2 * MIB
    assert r.peak_allocated_bytes == 1024 + 1024 + 512


def test_mid_sized_requests_get_a_20mib_segment_and_reuse_it():
    r = replay([(1, 3 * MIB), (1, -3 * MIB), (2, 5 * MIB)])
    assert r.peak_reserved_bytes == 20 * MIB
    assert r.segments == 1


def test_large_requests_round_to_2mib_and_fragment():
    # 30 MiB freed, then 31 MiB requested: the cached block is too small -> a new segment
    r = replay([(1, 30 * MIB), (1, -30 * MIB), (2, 31 * MIB)])
    assert r.peak_reserved_bytes == 30 * MIB + 32 * MIB
    # the 1 MiB remainder is not split off (large pool splits only > 1 MiB), and the allocator
    # counts whole blocks: max_memory_allocated sees 32 MiB
    assert r.peak_allocated_bytes == 32 * MIB


def test_freed_neighbours_merge():
    events = [(1, 12 * MIB), (2, 12 * MIB), (1, -12 * MIB), (2, -12 * MIB), (3, 24 * MIB)]
    # two 12 MiB segments cannot merge (different segments): a third is needed
    assert replay(events).segments == 3
    events = [(1, 2 * MIB), (2, 2 * MIB), (1, -2 * MIB), (2, -2 * MIB), (3, 4 * MIB)]
    # both came from one 20 MiB segment: after merging, 4 MiB fits in it
    assert replay(events).segments == 1


def test_at_the_card_limit_cached_segments_are_released_and_the_request_retried():
    # two 100 MiB tensors freed, then 150 MiB: unbounded the cache keeps both 100 MiB segments
    events = [(1, 100 * MIB), (2, 100 * MIB), (1, -100 * MIB), (2, -100 * MIB), (3, 150 * MIB)]
    assert replay(events).peak_reserved_bytes == 350 * MIB
    # under a 260 MiB limit the allocator frees both cached segments and retries once
    r = replay(events, capacity_bytes=260 * MIB)
    assert (r.peak_reserved_bytes, r.alloc_retries, r.out_of_memory) == (200 * MIB, 1, False)
    # a limit the live bytes themselves pass is an out-of-memory, not a retry that succeeds
    r = replay(events, capacity_bytes=140 * MIB)
    assert r.out_of_memory and r.peak_reserved_bytes <= 140 * MIB


def test_a_segment_still_partly_used_is_not_released():
    # a 20 MiB segment holds a live 1.5 MiB block and a freed 3 MiB one: it cannot be released
    events = [(1, 3 * MIB), (2, 3 * MIB // 2), (1, -3 * MIB), (3, 64 * MIB)]
    r = replay(events, capacity_bytes=80 * MIB)
    assert r.out_of_memory and r.alloc_retries == 1
    assert not replay(events, capacity_bytes=84 * MIB).out_of_memory


def test_empty_cache_gives_back_whole_free_segments_and_restarts_the_peak():
    from trainfit.memory.allocator import EMPTY_CACHE_UID, HISTORY_UID

    h = HISTORY_UID
    # before the step: a 100 MiB block freed (a whole segment), and a 20 MiB segment a live
    # 1.5 MiB block splits next to a freed 3 MiB one; then empty_cache and the step's 40 MiB
    events = [(h + 1, 100 * MIB), (h + 2, 3 * MIB), (5, 3 * MIB // 2), (h + 1, -100 * MIB),
              (h + 2, -3 * MIB), (EMPTY_CACHE_UID, 0), (6, 40 * MIB)]
    r = replay(events)
    # the split segment stays, the 100 MiB one is given back: the step's 40 MiB needs its own
    assert r.peak_reserved_bytes == 20 * MIB + 40 * MIB
    without = replay([e for e in events if e[0] != EMPTY_CACHE_UID])
    assert without.peak_reserved_bytes == 100 * MIB + 20 * MIB  # the step reuses the cache
    assert replay(events, expandable=True).peak_reserved_bytes < \
        replay([e for e in events if e[0] != EMPTY_CACHE_UID], expandable=True).peak_reserved_bytes
