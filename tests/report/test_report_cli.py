"""Bad input → one ``error:`` line naming the file and field, a ``hint:``, exit code 2, nothing written."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from report_paths import FIXTURES, SEED002, report_app
from typer.testing import CliRunner

from trainfit.report.load import ReportInputError
from trainfit.report.output import write_atomically

runner = CliRunner()
APP = report_app()


def _fails(args: list[str], *needles: str) -> str:
    res = runner.invoke(APP, ["report", *args])
    assert res.exit_code == 2, res.output
    errors = [ln for ln in res.stderr.splitlines() if ln.startswith("error:")]
    hints = [ln for ln in res.stderr.splitlines() if ln.startswith("hint:")]
    assert len(errors) == 1 and len(hints) == 1, res.stderr
    for n in needles:
        assert n in errors[0], errors[0]
    return errors[0]


def _write(tmp_path: Path, name: str, data: object) -> str:
    p = tmp_path / name
    p.write_text(data if isinstance(data, str) else json.dumps(data))
    return str(p)


def test_missing_file(tmp_path):
    out = tmp_path / "r.html"
    _fails([str(tmp_path / "nope.json"), "--out", str(out)], "nope.json", "file not found")
    assert list(tmp_path.iterdir()) == []


def test_malformed_json(tmp_path):
    bad = _write(tmp_path, "plan.json", '{"configs": [1, 2,')
    _fails([bad, "--out", str(tmp_path / "r.html")], "plan.json", "not valid JSON", "line 1")
    assert not (tmp_path / "r.html").exists()


@pytest.mark.parametrize("edit, needles", [
    (lambda d: d["probes"][2].pop("status"), ("tune.json", "probes[2].status", "missing")),
    (lambda d: d["probes"][0]["measured"].update(peak_device_bytes="12 GB"),
     ("tune.json", "probes[0].measured.peak_device_bytes", "expected a number")),
    (lambda d: d.update(probes={}), ("tune.json", "probes", "expected a list")),
    (lambda d: d["probes"][1].update(status="crashed"), ("tune.json", "probes[1].status", "crashed")),
    (lambda d: d.update(kind="tuning"), ("tune.json", "kind", "unknown kind 'tuning'")),
    (lambda d: d.pop("kind"), ("tune.json", "kind: missing")),
])
def test_bad_tune_field(tmp_path, edit, needles):
    data = json.loads((FIXTURES / "tune.json").read_text())
    edit(data)
    _fails([_write(tmp_path, "tune.json", data), "--out", str(tmp_path / "r.html")], *needles)
    assert not (tmp_path / "r.html").exists()


def test_a_binary_file_is_not_text_not_a_permission_problem(tmp_path):
    """An audit: random bytes as train.json were 'cannot read' with a hint about permissions."""
    p = tmp_path / "train.json"
    p.write_bytes(bytes(range(128, 256)) * 3)
    err = _fails([str(p), "--out", str(tmp_path / "r.html")], "train.json", "not a text file")
    res = runner.invoke(APP, ["report", str(p), "--out", str(tmp_path / "r.html")])
    assert "permissions" not in res.stderr and "json-formats" in res.stderr, err


def test_bad_plan_field(tmp_path):
    data = json.loads(SEED002.read_text())
    data["configs"][3]["peak_device_bytes"] = 1.5
    del data["configs"][4]["micro_batch"]
    _fails([_write(tmp_path, "plan.json", data), "--out", str(tmp_path / "r.html")],
           "plan.json", "configs[3].peak_device_bytes", "expected an integer")


@pytest.mark.parametrize("name, text, needles", [
    ("m.jsonl", '{"time_s": 0}\n{"time_s": 1}\nnot json\n', ("m.jsonl", "line 3", "not JSON")),
    ("m.jsonl", '{"time_s": 5}\n{"time_s": 1}\n', ("m.jsonl", "line 2", "time_s", "before")),
    ("m.jsonl", '{"time_s": 0, "gpu_util_percent": "high"}\n', ("line 1", "gpu_util_percent")),
    ("m.csv", "step,gpu_util_percent\n1,50\n", ("m.csv", "no time_s column")),
    ("m.csv", "time_s,gpu_util_percent\n0,50\n1,x\n", ("m.csv", "line 3", "gpu_util_percent")),
])
def test_bad_monitor_log(tmp_path, name, text, needles):
    _fails([_write(tmp_path, name, text), "--out", str(tmp_path / "r.html")], *needles)


def test_a_monitor_line_cut_by_a_killed_writer_is_skipped_and_said(tmp_path):
    """QA: a log whose writer was killed mid-line (the sampler then starts its next row on a line
    of its own) made the whole log unreadable. A cut object is skipped, with a warning; a line
    that is not JSON at all stays an error (test_bad_monitor_log)."""
    log = _write(tmp_path, "m.jsonl", '{"time_s": 0, "step": 1}\n{"time_s": 3.1, "step": 15\n'
                 '{"time_s": 4, "step": 16}\n{"time_s": 5, "st')
    out = tmp_path / "r.html"
    res = runner.invoke(APP, ["report", log, "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert "line 2 is cut off" in res.stderr and "line 4 is cut off" in res.stderr
    assert out.exists()
    # a CSV row short of the header's fields, or a last row without its line end, likewise
    # (an audit: a cut row drew a host RAM of 155 bytes as measured)
    log = _write(tmp_path, "m.csv", "time_s,host_ram_used_bytes,host_cpu_percent\n0,1546444800,3\n"
                 "1,15\n2,1546444800,4\n3,1546444800,1")
    res = runner.invoke(APP, ["report", log, "--out", str(tmp_path / "c.html")])
    assert res.exit_code == 0, res.output
    assert "m.csv: line 3 is cut off" in res.stderr and "m.csv: line 5 is cut off" in res.stderr
    from trainfit.report.monitor_log import load_monitor
    m = load_monitor(tmp_path / "m.csv", "m.csv", [])
    assert m.columns["host_ram_used_bytes"] == [1546444800.0, 1546444800.0]


def test_a_log_whose_only_line_is_cut_says_so_and_a_run_named_twice_is_read_once(tmp_path):
    """An audit: a monitor log whose only line was cut off read "no samples" / "the monitor log
    is empty"; a run directory given twice was drawn twice (run1, run1-2)."""
    log = _write(tmp_path, "m.jsonl", '{"time_s": 0, "st')
    _fails([log, "--out", str(tmp_path / "r.html")], "no samples: 1 line, cut off")
    run = tmp_path / "run"
    run.mkdir()
    (run / "train.json").write_text((FIXTURES / "train.json").read_text())
    out = tmp_path / "r.html"
    res = runner.invoke(APP, ["report", str(run), str(run / "train.json"), "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert "given more than once: read once" in res.stderr
    from trainfit.report.load import load_inputs

    assert len(load_inputs([str(run), str(run / "train.json")]).trains) == 1


def test_monitor_gaps_are_not_an_error(tmp_path):
    out = tmp_path / "r.html"
    res = runner.invoke(APP, ["report", str(FIXTURES / "monitor.csv"), "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert out.exists() and (tmp_path / "r-timeline-monitor.png").exists()


def test_unwritable_out(tmp_path):
    blocker = tmp_path / "file.txt"
    blocker.write_text("x")
    _fails([str(SEED002), "--out", str(blocker / "r.html")], "--out", "not a directory")
    _fails([str(SEED002), "--out", str(tmp_path / "missing" / "r.html")], "does not exist")
    _fails([str(SEED002), "--out", str(tmp_path)], "is a directory")
    _fails([str(SEED002), "--out", str(tmp_path / "r.md"), "--markdown"], "would replace the HTML")
    # the PNG directory cannot be made: the HTML must not be written either
    _fails([str(SEED002), "--out", str(tmp_path / "r.html"), "--png-dir", str(blocker / "png")],
           "--png-dir")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file.txt"]
    # a PNG directory is made, not a tree of them (an audit: /nonexistent/pngs made a new
    # top-level directory)
    _fails([str(SEED002), "--out", str(tmp_path / "r.html"), "--png-dir",
            str(tmp_path / "no" / "png")], "--png-dir", "does not exist")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file.txt"]
    # an existing node that is no regular file is not replaced (an audit: /dev/full became the
    # HTML, as root)
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    _fails([str(SEED002), "--out", str(fifo)], "is not a regular file")
    assert fifo.is_fifo() and sorted(p.name for p in tmp_path.iterdir()) == ["file.txt", "pipe"]


def test_atomic_write_leaves_nothing_on_failure(tmp_path):
    first, second = tmp_path / "a.html", tmp_path / "gone" / "b.png"
    with pytest.raises(ReportInputError, match=r"b\.png: cannot write"):
        write_atomically({first: b"<html>", second: b"png"})
    assert list(tmp_path.iterdir()) == []  # neither a.html nor its temporary


def test_writes_and_warns_about_missing_monitor_log(tmp_path):
    train = json.loads((FIXTURES / "train.json").read_text())
    train["monitor_log"] = "elsewhere.jsonl"
    path = _write(tmp_path, "train.json", train)
    out = tmp_path / "r.html"
    res = runner.invoke(APP, ["report", path, "--out", str(out), "--markdown"])
    assert res.exit_code == 0, res.output
    assert "warning:" in res.stderr and "monitor_log" in res.stderr
    assert out.exists() and out.with_suffix(".md").exists()


def test_registered_in_trainfit_app():
    from trainfit.cli.main import app

    res = runner.invoke(app, ["report", "--help"])
    assert res.exit_code == 0 and "--markdown" in res.output


def test_markdown_escapes_html_from_the_inputs(tmp_path):
    """A model name or note carrying HTML must not reach the Markdown raw (renderers pass raw HTML
    through): escaped as in the HTML report."""
    tune = json.loads((FIXTURES / "tune.json").read_text())
    evil = "<script>alert(1)</script>"
    tune["notes"] = [*tune.get("notes", []), evil]
    path = _write(tmp_path, "tune.json", tune)
    out = tmp_path / "r.html"
    res = runner.invoke(APP, ["report", path, "--out", str(out), "--markdown"])
    assert res.exit_code == 0, res.output
    md = out.with_suffix(".md").read_text()
    assert "<script>" not in md and "&lt;script&gt;" in md
    assert "<script>alert" not in out.read_text()


def test_train_configuration_says_where_the_run_went(tmp_path):
    """An OOM split leaves the job's micro-batch behind: the configuration row names both (the
    job's, then each micro-batch × accumulation the run moved to); a null checkpointing field
    is 'unknown', never 'None'."""
    train = json.loads((FIXTURES / "train.json").read_text())
    train["job"] = {**train["job"], "micro_batch": 32, "grad_accum": 1, "ranks": 2,
                    "grad_ckpt": None}
    train["oom_events"] = [
        {"step": 0, "phase": "step", "micro_batch_before": 32, "micro_batch_after": 16,
         "grad_accum_after": 2},
        {"step": 0, "phase": "step", "micro_batch_before": 16, "micro_batch_after": 8,
         "grad_accum_after": 4}]
    train["segments"] = [{"segment": 1, "start_step": 0, "end_step": 400, "steps": 400,
                          "micro_batch": 8, "grad_accum": 4}]
    path = _write(tmp_path, "train.json", train)
    out = tmp_path / "r.html"
    res = runner.invoke(APP, ["report", path, "--out", str(out), "--markdown"])
    assert res.exit_code == 0, res.output
    md = out.with_suffix(".md").read_text()
    assert ("checkpointing unknown, micro-batch 32 × 1 per rank × 2 ranks (the job as last run); "
            "ran at 16 × 2 → 8 × 4"
            in md)
    assert "checkpointing None" not in md
    # train.json's step 0 is the run's first step: numbered from 1, as the progress line does
    assert "step 1 (step): micro-batch 32 → 16; step 1 (step): micro-batch 16 → 8" in md


def test_json_prints_the_report_it_wrote_and_a_json_error_on_bad_input(tmp_path):
    """An audit: every command had --json but report. --json prints the built report (its
    numbers, as report/model.py holds them) after writing the files; bad input prints the one
    error object as the other commands do, nothing written."""
    from trainfit.report import build_report, load_inputs

    files = [str(FIXTURES / n) for n in ("plan_seed002.json", "tune.json", "doctor.json")]
    out = tmp_path / "r.html"
    res = runner.invoke(APP, ["report", *files, "--out", str(out), "--json"])
    assert res.exit_code == 0, res.output
    d = json.loads(res.stdout)
    assert d["kind"] == "report" and d["written"][0] == str(out) and out.is_file()
    built = build_report(load_inputs(files))
    assert [s["title"] for s in d["sections"]] == [s.title for s in built.sections]
    assert d["sections"][0]["capacity_gib"] == pytest.approx(built.sections[0].capacity_gib)
    assert len(d["doctors"]) == 1 and d["sources"][0] == [files[0], "plan"]
    # a report's JSON is not an input
    again = tmp_path / "again.html"
    (tmp_path / "report.json").write_text(res.stdout)
    bad = runner.invoke(APP, ["report", str(tmp_path / "report.json"), "--out", str(again),
                              "--json"])
    assert bad.exit_code == 2 and not again.exists()
    err = json.loads(bad.stdout)
    assert err["exit_code"] == 2 and "unknown kind 'report'" in err["error"]
