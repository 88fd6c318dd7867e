"""The phase clock's exclusive accounting, on a fake clock (numbers, never wall-clock times)."""

from __future__ import annotations

import pytest

from trainfit.doctor import split
from trainfit.doctor.split import PhaseClock, StepRecord, median_split


@pytest.fixture()
def fake_time(monkeypatch):
    now = [0.0]
    monkeypatch.setattr(split.time, "perf_counter", lambda: now[0])
    return now


def test_nested_phases_are_exclusive_and_add_up(fake_time):
    c = PhaseClock()
    c.start()
    c.push("data_wait")
    fake_time[0] = 2.0
    c.pop()
    c.set_base("forward")
    fake_time[0] = 5.0
    c.push("sync")  # a .item() inside the forward: charged to sync, not forward
    fake_time[0] = 6.0
    c.pop()
    fake_time[0] = 7.0
    c.set_base("backward")
    fake_time[0] = 10.0
    c.set_base("other")
    fake_time[0] = 11.0
    rec = c.end_step()
    assert rec.phases_s == {"data_wait": 2.0, "h2d_copy": 0.0, "forward": 4.0, "backward": 3.0,
                            "optimizer": 0.0, "sync": 1.0, "logging_io": 0.0, "other": 1.0}
    assert rec.step_time_s == 11.0
    assert sum(rec.phases_s.values()) == pytest.approx(rec.step_time_s)
    assert rec.hook_calls == 5


def test_untimed_sync_points_get_the_timed_mean(fake_time):
    c = PhaseClock()
    c.start()
    n_calls = 8 + 64 * 3  # 8 timed one by one, then 1 in 64
    for _ in range(n_calls):
        n = c.sync_n = c.sync_n + 1
        if n <= PhaseClock.SYNC_TIME_FIRST or n % PhaseClock.SYNC_TIME_EVERY == 0:
            c.sync_timed(n)
            fake_time[0] += 1.0  # each timed call: 1 s
            c.pop()
        else:
            fake_time[0] += 1.0  # untimed calls cost the same, charged to "other" for now
    rec = c.end_step()
    assert rec.counters["sync_calls"] == n_calls
    assert rec.counters["sync_timed"] == 11
    assert rec.phases_s["sync"] == pytest.approx(n_calls)  # every call estimated at the 1 s mean
    assert rec.phases_s["other"] == pytest.approx(0.0)


def test_median_split_puts_the_rest_in_other():
    recs = [StepRecord({"data_wait": w, "forward": 1.0, "backward": 2.0}, 3.0 + w + 0.5)
            for w in (1.0, 2.0, 3.0)]
    s = median_split(recs)
    assert s.step_time_s == 5.5
    assert s.data_wait_s == 2.0
    assert s.other_s == pytest.approx(0.5)
    assert s.step_time_spread_s == 2.0
    assert s.idle_s is None
    assert s.fraction("data_wait_s") == pytest.approx(2 / 5.5)
    assert s.parts_scale == 1.0  # the parts' medians did not pass the step: nothing scaled
