"""The live-bytes tracker holds one entry per *live* storage: a long ``train --memory-limit`` run
(millions of operations) does not grow it. Before: one weak reference per storage ever created
(60,000 after 60,000 operations with 64 bytes live)."""

import torch

from trainfit.memory.limit import LimitTracker


def test_tracker_memory_is_bounded_on_a_long_loop():
    tracker = LimitTracker(10**9)
    x = torch.ones(16)
    tracker.track(x, "parameters")
    with tracker:
        for i in range(20_000):
            y = x * 2 + i  # two storages created and freed per iteration
            del y
    assert tracker.current_bytes == 64  # only x is alive
    assert len(tracker._refs) == 1 and len(tracker._alive) == 1 and len(tracker._live) == 1
    assert tracker.peak.peak_bytes == 64 * 3  # x, x * 2 and the sum at the same time


def test_released_blocks_still_release_their_bytes():
    tracker = LimitTracker(10**9)
    with tracker:
        keep = [torch.zeros(256) for _ in range(10)]
        assert tracker.current_bytes == 10 * 1024 and len(tracker._refs) == 10
        del keep[5:]
    assert tracker.current_bytes == 5 * 1024 and len(tracker._refs) == 5
