"""The run directory: what marks one as holding a run, so a new run never writes into it."""

from __future__ import annotations

import pytest

from trainfit.report.load import load_inputs
from trainfit.run.rundir import RunDir, check_no_run, holds_run, set_aside_watch_files


def test_a_run_killed_before_its_first_checkpoint_leaves_its_monitor_files_set_aside(tmp_path):
    """An audit: a run SIGKILLed before its first checkpoint left monitor.jsonl (and tensorboard/)
    alone; a new run into the same --out appended to them unsaid, and report drew both runs as
    one timeline. The new run sets them aside (kept, numbered) and starts its own; a run that
    fails before its first step puts them back."""
    out = tmp_path / "nk"
    out.mkdir()
    (out / "monitor.jsonl").write_text('{"time_s": 0.0, "step": 7}\n{"time_s": 1.0, "step": 15}\n')
    (out / "tensorboard").mkdir()
    assert holds_run(out) == []
    check_no_run(out)
    # report reads such a directory's monitor log, and says why that alone is shown
    inputs = load_inputs([str(out)])
    assert [m.path for m in inputs.monitors] == [str(out / "monitor.jsonl")]
    assert inputs.monitors[0].columns["step"] == [7.0, 15.0]
    assert any("no train.json" in w for w in inputs.warnings)
    with pytest.raises(RuntimeError), RunDir(out, resuming=False) as claim:
        assert sorted(p.name for p in out.iterdir() if not p.name.startswith(".")) == [
            "monitor.previous.jsonl", "tensorboard.previous"]
        assert "set aside as monitor.previous.jsonl and tensorboard.previous" in claim.notes[0]
        raise RuntimeError("failed before its first step")
    assert sorted(p.name for p in out.iterdir() if not p.name.startswith(".")) == [
        "monitor.jsonl", "tensorboard"]
    # a second dead run's are numbered, the first's kept
    (out / "monitor.previous.jsonl").write_text("{}\n")
    assert [b.name for _, b in set_aside_watch_files(out)] == ["monitor.previous-2.jsonl",
                                                               "tensorboard.previous"]


def test_an_empty_or_unrelated_directory_holds_no_run(tmp_path):
    (tmp_path / "notes.txt").write_text("x")
    assert holds_run(tmp_path) == []
    check_no_run(tmp_path)  # no error
