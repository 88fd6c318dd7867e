"""The sampler: documented columns in JSONL and CSV, step-derived numbers exactly as fed."""

from __future__ import annotations

import csv
import importlib.util
import json
import os
import sys

import pytest
from fake_nvml import FOREIGN_PID, GIB, make_fake_pynvml

from trainfit.monitor import COLUMNS, MonitorError, Sampler
from trainfit.monitor.view import plain_line, render

# docs/json-formats.md, `monitor.jsonl`, in its order: the contract with `trainfit report`.
DOC_COLUMNS = [
    "time_s", "step", "loss", "tokens_per_s", "samples_per_s", "mfu", "data_wait_fraction",
    "peak_allocated_bytes", "peak_reserved_bytes", "gpu_index", "gpu_util_percent", "gpu_memory_used_bytes",
    "gpu_memory_total_bytes", "gpu_power_w", "gpu_sm_clock_mhz", "process_gpu_memory_bytes",
    "host_ram_used_bytes", "host_ram_total_bytes", "host_swap_used_bytes", "process_rss_bytes",
    "host_cpu_percent",
]


def _feed(s: Sampler) -> None:
    # Two steps of 0.5 s each: 2048 tokens and 8 samples in 1.0 s, 0.375 s of it waiting for data.
    s.record_step(step=1, loss=3.0, tokens=1024, samples=4, step_time_s=0.5, data_wait_s=0.25,
                  peak_allocated_bytes=100, peak_reserved_bytes=200)
    s.record_step(step=2, loss=2.5, tokens=1024, samples=4, step_time_s=0.5, data_wait_s=0.125, mfu=0.4,
                  peak_allocated_bytes=150, peak_reserved_bytes=180)


EXPECTED = {"step": 2, "loss": 2.5, "tokens_per_s": 2048.0, "samples_per_s": 8.0, "mfu": 0.4,
            "data_wait_fraction": 0.375, "peak_allocated_bytes": 150, "peak_reserved_bytes": 200}


def test_columns_are_the_documented_ones():
    assert list(COLUMNS) == DOC_COLUMNS


def test_jsonl_log_with_step_numbers(no_nvml, tmp_path):
    log = tmp_path / "monitor.jsonl"
    s = Sampler(log_path=log, live=False)
    before = s.sample_once()[0]
    _feed(s)
    after = s.sample_once()[0]
    again = s.sample_once()[0]   # no step since: the same window's numbers, same step
    s.stop()
    assert all(before[k] is None for k in EXPECTED)
    assert {k: after[k] for k in EXPECTED} == EXPECTED
    assert {k: again[k] for k in EXPECTED} == EXPECTED
    assert after["process_rss_bytes"] > 0 and after["host_ram_total_bytes"] > 0
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(lines) == 3 and lines == s.rows
    assert all(list(r) == DOC_COLUMNS for r in lines)
    assert lines[1]["tokens_per_s"] == 2048.0 and lines[1]["data_wait_fraction"] == 0.375
    assert lines[0]["time_s"] <= lines[1]["time_s"] <= lines[2]["time_s"]


def test_an_evaluation_with_no_number_is_logged_as_null(no_nvml, tmp_path):
    """An evaluation without label tokens used to reach monitor.jsonl as NaN (an audit): not
    JSON, and jq or JSON.parse refuse the whole log."""
    log = tmp_path / "monitor.jsonl"
    s = Sampler(log_path=log, live=False)
    _feed(s)
    s.record_eval(step=2, eval_loss=float("nan"), eval_perplexity=float("inf"))
    s.stop()

    def refuse(name: str) -> None:
        raise AssertionError(f"monitor.jsonl holds {name}")

    rows = [json.loads(line, parse_constant=refuse) for line in log.read_text().splitlines()]
    (ev,) = [r for r in rows if r.get("eval_step") == 2]
    assert (ev["eval_loss"], ev["eval_perplexity"]) == (None, None)


def test_csv_log_with_fixed_header(no_nvml, tmp_path):
    log = tmp_path / "monitor.csv"
    s = Sampler(log_path=log, live=False)
    _feed(s)
    s.sample_once()
    s.stop()
    with log.open(newline="") as f:
        reader = csv.DictReader(f)
        rows = list(reader)
    assert reader.fieldnames == DOC_COLUMNS
    assert len(rows) == 1
    assert float(rows[0]["tokens_per_s"]) == 2048.0
    assert float(rows[0]["data_wait_fraction"]) == 0.375
    assert float(rows[0]["samples_per_s"]) == 8.0
    assert rows[0]["gpu_index"] == "" and rows[0]["step"] == "2"   # null → empty cell


def test_rates_without_step_time_and_empty_window(no_nvml):
    s = Sampler(live=False)
    s.sample_once()
    s.record_step(step=7, loss=1.0)  # no tokens, no times: rates stay unknown
    row = s.sample_once()[0]
    s.stop()
    assert (row["step"], row["loss"], row["tokens_per_s"], row["data_wait_fraction"]) == (7, 1.0, None, None)


def test_two_gpus_one_row_each(monkeypatch, tmp_path):
    me = os.getpid()
    fake = make_fake_pynvml(processes={0: {"compute": [(me, 3 * GIB), (FOREIGN_PID, 9 * GIB)]},
                                       1: {"compute": [], "graphics": []}})
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    s = Sampler(log_path=tmp_path / "m.jsonl", live=False)
    _feed(s)
    rows = s.sample_once()
    s.stop()
    assert [r["gpu_index"] for r in rows] == [0, 1]
    assert [r["process_gpu_memory_bytes"] for r in rows] == [3 * GIB, 0]
    assert [r["gpu_memory_total_bytes"] for r in rows] == [80 * GIB, 24 * GIB]
    assert [r["gpu_power_w"] for r in rows] == [350.5, None]
    assert all(r["tokens_per_s"] == 2048.0 for r in rows)   # step metrics on every GPU row
    assert len((tmp_path / "m.jsonl").read_text().splitlines()) == 2
    line = plain_line(rows)
    assert "gpu0 util 87 % mem 40.00/80.00 GiB 350 W 1980 MHz proc 3.00 GiB" in line
    assert "2,048 tokens/s" in line and "data wait 37.5 % of step time" in line
    render(rows, gpu_names=s.gpu_names, interval_s=1.0)  # builds without error
    # a small process is in MiB, not "0.00 GiB" (an audit)
    from trainfit.monitor.view import host_line
    assert host_line({**rows[0], "process_rss_bytes": 1_900_000}).endswith(
        "process tree RSS 1.8 MiB")
    assert host_line({**rows[0], "process_rss_bytes": 3 * GIB}).endswith("RSS 3.00 GiB")
    with pytest.raises(MonitorError, match="GPU index 5 not visible"):
        Sampler(gpu_indices=[5], live=False).open()


def test_thread_logs_last_steps_on_stop(no_nvml, tmp_path, capsys):
    log = tmp_path / "m.jsonl"
    with Sampler(interval_s=0.01, log_path=log, live=False, print_lines=True) as s:
        for i in range(1, 4):
            s.record_step(step=i, tokens=10, step_time_s=0.5)
    assert s.rows[-1]["step"] == 3                       # stop() takes a last sample
    assert len(log.read_text().splitlines()) == len(s.rows) == s.samples
    out = capsys.readouterr().out.splitlines()
    assert len(out) == s.samples and all("host RAM" in line for line in out)
    assert s.sample_cpu_s > 0.0  # the sampler's own CPU time is counted (psutil reads cost some)


def test_an_appended_log_keeps_the_downtime_as_a_gap(no_nvml, tmp_path):
    """A run killed 30 s before its resume appends to its log: time_s goes on from the last row
    plus the 30 s the log was idle (its mtime), so the report finds the gap (a review: the new
    rows came 0.1 ms after the old, and the lines ran straight over the restart)."""
    import os
    import time

    from trainfit.report.timeline import find_gaps

    log = tmp_path / "m.jsonl"
    log.write_text(json.dumps({"time_s": 5.0}) + "\n")
    idle = time.time() - 30
    os.utime(log, (idle, idle))
    s = Sampler(interval_s=1.0, log_path=log, live=False, append=True)
    row = s.sample_once()[0]
    s.close()
    assert 35.0 <= row["time_s"] < 40.0
    # beside the killed run's 1-s samples, the 30 s are a gap the report does not draw across
    _, gaps = find_gaps([3.0, 4.0, 5.0, row["time_s"], row["time_s"] + 1.0])
    assert gaps == [(5.0, row["time_s"])]


def test_no_rate_is_held_while_the_run_evaluates_or_saves(no_nvml):
    """An audit: samples taken during a 9-s evaluation and a checkpoint save carried the last
    steps' 100 tokens/s. Paused with no step since the previous sample: the rates are null, the
    step and loss kept; steps that ended before the pause keep theirs; unpaused: held again."""
    s = Sampler(interval_s=1.0, live=False)
    _feed(s)
    s.pause_rates("evaluation")
    first = s.sample_once()[0]                  # the two steps ended before the pause: kept
    during = s.sample_once()[0]
    s.pause_rates(None)
    after = s.sample_once()[0]
    s.close()
    assert first["tokens_per_s"] == 2048.0
    assert {k: during[k] for k in ("tokens_per_s", "samples_per_s", "mfu",
                                   "data_wait_fraction")} == dict.fromkeys(
        ("tokens_per_s", "samples_per_s", "mfu", "data_wait_fraction"))
    assert during["step"] == 2 and during["loss"] == 2.5 and during["peak_allocated_bytes"] == 150
    assert after["tokens_per_s"] == 2048.0     # a long step in progress: held, as before


def test_no_gpus_asked_reads_none_on_a_host_that_has_them(monkeypatch, tmp_path):
    """train on CPU passes gpu_indices=[]: another process's GPUs are not the run's (an audit:
    their readings were drawn beside a CPU run's tensor count)."""
    import sys

    monkeypatch.setitem(sys.modules, "pynvml", make_fake_pynvml())
    s = Sampler(interval_s=1.0, live=False, gpu_indices=[])
    rows = s.sample_once()
    s.close()
    assert len(rows) == 1 and rows[0]["gpu_index"] is None
    assert rows[0]["gpu_memory_total_bytes"] is None and rows[0]["host_ram_total_bytes"] > 0
    s = Sampler(interval_s=1.0, live=False)
    assert [r["gpu_index"] for r in s.sample_once()] == [0, 1]
    s.close()


def test_an_appended_csv_log_goes_on_in_time_and_reads_back(no_nvml, tmp_path):
    """An audit: a CSV log appended to restarted time_s at 0, and report then refused the
    monitor's own file (time going back); a JSONL one went on."""
    from trainfit.report.load import load_inputs

    log = tmp_path / "m.csv"
    for _ in range(2):
        s = Sampler(interval_s=1.0, log_path=log, live=False, append=True)
        s.sample_once()
        s.sample_once()
        s.close()
    times = [float(line.split(",")[0]) for line in log.read_text().splitlines()[1:]]
    assert len(times) == 4 and times == sorted(times) and times[2] >= times[1]
    (timeline,) = load_inputs([str(log)]).monitors
    assert timeline.samples == 4
    # a row cut inside its first field (a killed writer): its "3" is not the last time
    with log.open("a") as f:
        f.write("3")
    s = Sampler(interval_s=1.0, log_path=log, live=False, append=True)
    row = s.sample_once()[0]
    s.close()
    assert row["time_s"] >= times[-1]


@pytest.mark.parametrize("kwargs, needle", [
    ({"interval_s": 0}, "--interval 0: must be > 0"),
    ({"interval_s": -1.0}, "must be > 0"),
    ({"log_path": "m.txt"}, "unknown log format '.txt'"),
    ({"log_path": "/no/such/dir/m.csv"}, "does not exist"),
    ({"pid": 2**22 + 1}, "no such process"),
])
def test_bad_options_raise_before_anything_is_written(kwargs, needle, tmp_path):
    with pytest.raises(MonitorError, match=needle) as err:
        Sampler(**kwargs)
    assert err.value.hint


def test_tensorboard_absent_is_a_note(no_nvml, tmp_path):
    if importlib.util.find_spec("tensorboard") is not None:
        pytest.skip("tensorboard is installed here")
    s = Sampler(tensorboard_dir=tmp_path / "tb", live=False)
    s.sample_once()
    s.stop()
    assert any("tensorboard not installed" in n for n in s.notes)
    assert not (tmp_path / "tb").exists()
