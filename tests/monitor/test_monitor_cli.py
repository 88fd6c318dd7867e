"""`trainfit monitor`: --once --json, the no-GPU line, bad input → error + hint, exit 2, nothing written."""

from __future__ import annotations

import json
import os
import sys

import pytest
from fake_nvml import make_fake_pynvml
from typer.testing import CliRunner

from trainfit.cli.main import app

runner = CliRunner()
NO_SUCH_PID = 2**22 + 1


def test_once_json_without_gpu(no_nvml):
    res = runner.invoke(app, ["monitor", "--once", "--json"])
    assert res.exit_code == 0, res.output
    rows = json.loads(res.stdout)
    assert len(rows) == 1 and rows[0]["gpu_index"] is None and rows[0]["host_ram_total_bytes"] > 0
    assert rows[0]["process_rss_bytes"] is None          # no --pid: no process followed
    assert "no NVIDIA GPU visible (NVML: Driver Not Loaded); showing the host only" in res.stderr


def test_once_json_two_gpus_pid_and_csv(monkeypatch, tmp_path):
    me = os.getpid()
    monkeypatch.setitem(sys.modules, "pynvml", make_fake_pynvml(processes={0: {"compute": [(me, 2**30)]}}))
    log = tmp_path / "m.csv"
    res = runner.invoke(app, ["monitor", "--once", "--json", "--pid", str(me), "--log", str(log)])
    assert res.exit_code == 0, res.output
    rows = json.loads(res.stdout)
    assert [r["gpu_index"] for r in rows] == [0, 1]
    assert rows[0]["process_gpu_memory_bytes"] == 2**30 and rows[0]["process_rss_bytes"] > 0
    assert len(log.read_text().splitlines()) == 3         # header + one row per GPU
    assert "no NVIDIA GPU" not in res.stderr


def test_once_table(no_nvml):
    res = runner.invoke(app, ["monitor", "--once"])
    assert res.exit_code == 0, res.output
    assert "host RAM" in res.stdout and "GiB" in res.stdout


def test_duration_plain_lines_and_log(no_nvml, tmp_path):
    log = tmp_path / "m.jsonl"
    res = runner.invoke(app, ["monitor", "--interval", "0.05", "--duration", "0.2", "--log", str(log)])
    assert res.exit_code == 0, res.output
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    lines = [line for line in res.stdout.splitlines() if line.startswith("t=")]
    assert len(rows) >= 1 and len(lines) == len(rows)   # not a TTY: one plain line per sample


@pytest.mark.parametrize("args, needle", [
    (["--pid", str(NO_SUCH_PID)], f"--pid {NO_SUCH_PID}: no such process"),
    (["--interval", "0"], "--interval 0: must be > 0"),
    (["--interval", "-2"], "--interval -2: must be > 0"),
    (["--duration", "0"], "--duration 0: must be > 0"),
    (["--pid", "-5"], "--pid -5: must be a process id"),
    (["--interval", "inf"], "--interval inf: must be > 0 and ≤ 86400"),
    (["--duration", "inf"], "--duration inf: must be > 0 seconds (finite)"),
    (["--log", "{tmp}/nodir/m.csv"], "does not exist"),
    (["--log", "{tmp}/m.txt"], "unknown log format '.txt'"),
])
def test_bad_input_exit_2_nothing_written(args, needle, tmp_path, no_nvml):
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    if "--log" not in args:
        args += ["--log", str(tmp_path / "m.jsonl")]
    res = runner.invoke(app, ["monitor", "--once", *args])
    assert res.exit_code == 2
    err = res.stderr.splitlines()
    assert err[0].startswith("error: ") and needle in err[0]
    assert err[1].startswith("hint: ")
    assert res.stdout == ""
    assert list(tmp_path.iterdir()) == []


def test_an_existing_log_is_appended_to_not_overwritten(no_nvml, tmp_path):
    log = tmp_path / "m.jsonl"
    for _ in range(2):
        res = runner.invoke(app, ["monitor", "--once", "--json", "--log", str(log)])
        assert res.exit_code == 0, res.output
    rows = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(rows) == 2 and rows[1]["time_s"] >= rows[0]["time_s"]
    assert f"--log {log}: exists, appending to it" in res.stderr


def test_a_live_runs_own_log_is_refused(no_nvml, tmp_path):
    """An audit: ``monitor --log RUN/monitor.jsonl`` beside a live ``train`` appended into the
    run's own log; the two writers' rows interleaved and report drew neither.  The run's lock is
    held: refused, nothing written; once the run is gone the log is appended to."""
    from trainfit.run.rundir import RunLock

    run = tmp_path / "run"
    run.mkdir()
    lock = RunLock(run)
    lock.acquire()
    try:
        res = runner.invoke(app, ["monitor", "--once", "--log", str(run / "monitor.jsonl")])
        assert res.exit_code == 2, res.output
        assert "another trainfit run is using this directory" in res.stderr
        assert "which writes its own monitor log there" in res.stderr
        assert "give a --log path outside the run's directory" in res.stderr
        assert not (run / "monitor.jsonl").exists()
    finally:
        lock.release()
    res = runner.invoke(app, ["monitor", "--once", "--json", "--log", str(run / "monitor.jsonl")])
    assert res.exit_code == 0, res.output


def test_a_zombie_process_has_no_rss(monkeypatch):
    """An audit: after the followed process exited (a zombie until reaped) its rows logged
    ``process_rss_bytes: 0`` — "process tree RSS 0.0 MiB (measured)"; unknown is None."""
    import psutil

    from trainfit.monitor.host import tree_rss_bytes

    class Zombie:
        def status(self):
            return psutil.STATUS_ZOMBIE

        def memory_info(self):
            raise AssertionError("a zombie's RSS is not read")

    assert tree_rss_bytes([Zombie()]) is None
    assert tree_rss_bytes([psutil.Process()]) > 0
