"""A run's progress line: step / total, tokens/s and time left from measured step times; piped,
one line at the first step, at most one per interval, and one at the last."""

from __future__ import annotations

import io

import pytest

from trainfit.monitor import progress as prog
from trainfit.monitor.progress import ProgressLog, StepProgress, duration_words


@pytest.fixture()
def clock(monkeypatch):
    t = {"now": 100.0}
    monkeypatch.setattr(prog.time, "monotonic", lambda: t["now"])
    return t


def test_rate_and_eta_from_the_steps_after_the_first(clock):
    p = StepProgress(total_steps=10)
    p.record(1, tokens=1000, step_time_s=5.0, loss=3.0)  # start-up step: not in the rate
    assert p.eta_s is None and p.tokens_per_s is None
    for step in (2, 3, 4):
        clock["now"] += 2.0
        p.record(step, tokens=1000, step_time_s=2.0, loss=2.5)
    assert p.seconds_per_step == pytest.approx(2.0)
    assert p.tokens_per_s == pytest.approx(500.0)
    assert p.eta_s == pytest.approx(6 * 2.0)
    assert p.elapsed_s == pytest.approx(6.0 + 5.0)
    line = p.line()
    assert line.startswith("step 4/10 (40 %)") and "500 tokens/s" in line and "ETA 12 s" in line


def test_resumed_run_counts_from_its_start(clock):
    p = StepProgress(total_steps=100, start_step=50)
    p.record(51, tokens=10, step_time_s=1.0, loss=None)
    clock["now"] += 1.0
    p.record(52, tokens=10, step_time_s=1.0, loss=None)
    assert p.done == 2 and p.eta_s == pytest.approx(48.0)
    trainer = StepProgress(total_steps=100)  # an HF trainer says where it resumed by its first step
    trainer.record(51, tokens=10, step_time_s=1.0, loss=None)
    assert trainer.start_step == 50


def test_log_prints_first_every_interval_and_last(clock):
    out = io.StringIO()
    p = StepProgress(total_steps=30)
    log = ProgressLog(p, every_s=10.0, stream=out)
    for step in range(1, 31):
        clock["now"] += 1.0
        p.record(step, tokens=1, step_time_s=1.0, loss=1.0)
        log.step()
    lines = out.getvalue().splitlines()
    assert [ln.split()[1] for ln in lines] == ["1/30", "11/30", "21/30", "30/30"]


def test_a_one_step_segment_ends_without_placeholders(clock):
    """A resume that runs one step printed "tokens/s after the first step · … · ETA after the
    second step" at 100 % (an audit): the last line promises no later one."""
    p = StepProgress(total_steps=8, start_step=7)
    p.record(8, tokens=256, step_time_s=4.0, loss=7.9)
    assert p.line() == "step 8/8 (100 %) · loss 7.9 · elapsed 4 s (measured)"
    q = StepProgress(total_steps=8)
    q.record(1, tokens=256, step_time_s=4.0, loss=7.9)
    assert "tokens/s after the first step" in q.line() and "ETA after the second step" in q.line()


def test_duration_words():
    assert duration_words(42) == "42 s"
    assert duration_words(0.3) == "0.3 s" and duration_words(0.004) == "0.004 s"  # not "0 s"
    assert duration_words(75) == "1 min 15 s"
    assert duration_words(4000) == "1 h 06 min"
