"""The report's train sections (report/runs.py): how a run ended, where its micro-batch went,
its OOM events, losses, evaluations and segments, from train.json files."""

from __future__ import annotations

import json
import re

import pytest
from report_paths import FIXTURES

from trainfit.report import build_report, load_inputs


def test_ran_at_orders_a_resumed_segments_first_split_after_the_previous_end(tmp_path):
    """A run at 8 × 1 for 2 steps, resumed and split 8 → 4 in its first step (train.json's
    step 2: the steps done before it, the previous segment's end): 'ran at 4 × 2', not
    '4 × 2 → 8 × 1 → 4 × 2' (a review's case)."""
    train = json.loads((FIXTURES / "train.json").read_text())
    train["job"] = {**train["job"], "micro_batch": 8, "grad_accum": 1, "ranks": 1}
    train["oom_events"] = [{"step": 2, "phase": "step", "micro_batch_before": 8,
                            "micro_batch_after": 4, "grad_accum_after": 2}]
    train["segments"] = [{"segment": 1, "start_step": 0, "end_step": 2, "micro_batch": 8,
                          "grad_accum": 1},
                         {"segment": 2, "start_step": 2, "end_step": 4, "micro_batch": 4,
                          "grad_accum": 2}]
    p = tmp_path / "train.json"
    p.write_text(json.dumps(train))
    (t,) = build_report(load_inputs([str(p)])).trains
    assert t.ran_at == ["4 × 2"]


def test_a_run_that_ended_on_an_oom_says_so(tmp_path):
    """An audit: a run that stopped on an OOM at micro-batch 1 read "OOM events: none" beside
    "ended: failed"; the error was in a note alone."""
    from trainfit.report.tables import train_text

    train = json.loads((FIXTURES / "train.json").read_text())
    train["stopped"] = "failed"
    train["notes"] = [*train.get("notes", []), "failed: out of memory in step 2 with micro-batch 1"]
    p = tmp_path / "train.json"
    p.write_text(json.dumps(train))
    (t,) = build_report(load_inputs([str(p)])).trains
    assert t.ended == "failed: out of memory in step 2 with micro-batch 1"
    rows = dict((r[0], r[1]) for r in train_text(t).rows)
    assert rows["OOM events (survived)"].endswith("the run ended on one (see ended)")


def test_an_evaluation_oom_is_read_by_its_own_keys(tmp_path):
    """train writes an evaluation's OOM with eval_batch_* keys (run/oom.py): the report read
    micro_batch_* only and refused every such train.json (a review). It is read, said as the
    evaluation's batch, and does not count as a training micro-batch change."""
    from trainfit.report.tables import train_text
    from trainfit.run.oom import OomEvent as RunOom

    train = json.loads((FIXTURES / "train.json").read_text())
    train["job"] = {**train["job"], "micro_batch": 8, "grad_accum": 1, "ranks": 1}
    train["oom_events"] = [RunOom(step=2, phase="eval", batch_before=8, batch_after=4).to_dict()]
    train["segments"] = [{"segment": 1, "start_step": 0, "end_step": 4, "micro_batch": 8,
                          "grad_accum": 1}]
    p = tmp_path / "train.json"
    p.write_text(json.dumps(train))
    (t,) = build_report(load_inputs([str(p)])).trains
    (e,) = t.oom_events
    assert (e.phase, e.step, e.micro_batch_before, e.micro_batch_after) == ("eval", 2, 8, 4)
    assert t.ran_at == []  # one configuration throughout: the evaluation split is not a change
    rows = dict((r[0], r[1]) for r in train_text(t).rows)
    assert rows["OOM events (survived)"] == "evaluation after step 2: evaluation batch 8 → 4"
    assert ", micro-batch 8 × 1 (the job as last run)" in rows["configuration"]
    # a run of 2 ranks says the micro-batch is each one's and the tokens all of theirs
    train["job"]["ranks"] = 2
    p.write_text(json.dumps(train))
    (t,) = build_report(load_inputs([str(p)])).trains
    rows = dict((r[0], r[1]) for r in train_text(t).rows)
    assert ", micro-batch 8 × 1 per rank × 2 ranks (the job as last run)" in rows["configuration"]
    assert ("tokens/s, tokens ÷ wall time (the training loop's: saves and evaluation included, "
            "model loading and tokenizing not, all 2 ranks)") \
        in rows


def test_an_interrupted_run_reads_as_one(tmp_path):
    """train.json's ``stopped``/``signal`` and its segments reach the report's table (an
    interrupted run was shown like a finished one)."""
    from trainfit.report.tables import train_text

    d = json.loads((FIXTURES / "train.json").read_text())
    d.update(stopped="interrupted", signal="SIGINT",
             segments=[{"start_step": 0, "end_step": 3}, {"start_step": 3, "end_step": d["steps"]}])
    p = tmp_path / "train.json"
    p.write_text(json.dumps(d))
    (t,) = build_report(load_inputs([str(p)])).trains
    assert t.ended == f"interrupted (SIGINT) after step {d['steps']}: resume with --resume on its directory"
    assert t.segments == 2
    rows = dict(train_text(t).rows)
    assert rows["ended"] == t.ended
    assert rows["segments (each run that trained this record)"] == (
        f"1: steps 1–3, end not recorded; 2: steps 4–{d['steps']}, end not recorded")


def test_a_training_run_shows_its_losses_evaluations_and_segments(tmp_path):
    """An audit: the report of a training run dropped train.json's losses, evaluations and
    segments (where a resume began, how each run stopped); a run directory was refused as "a
    directory"; a run killed outright read "running"."""
    from trainfit.report.figures import render_figures
    from trainfit.report.tables import train_text

    d = json.loads((FIXTURES / "train.json").read_text())
    d.update(steps=5, losses=[4.0, 3.5, None, 3.0, 3.25], final_loss=3.25, stopped="running",
             evals=[{"step": 2, "eval_loss": 3.6, "eval_perplexity": 36.6},
                    {"step": 4, "eval_loss": 3.7, "eval_perplexity": 40.4}],
             segments=[{"segment": 1, "start_step": 0, "end_step": 2, "stopped": "interrupted"},
                       {"segment": 2, "start_step": 2, "end_step": 5, "stopped": "running",
                        "resumed_from": "run/checkpoint-2"}])
    d.pop("monitor_log", None)
    run = tmp_path / "run"
    run.mkdir()
    (run / "train.json").write_text(json.dumps(d))
    report = build_report(load_inputs([str(run)]))  # the directory, as train names it
    (t,) = report.trains
    rows = dict(train_text(t).rows)
    assert rows["training loss over the steps"] == (
        "4.0000 at step 1 → 3.2500 at step 5; lowest 3.0000 at step 4; 1 step(s) not finite "
        "(the loss figure draws each)")
    assert rows["evaluation"] == ("2 evaluation(s); last: loss 3.7000 at step 4, perplexity "
                                  "40.4; lowest: 3.6000 at step 2")
    assert rows["segments (each run that trained this record)"] == (
        "1: steps 1–2, interrupted; 2: steps 3–5, running, from run/checkpoint-2")
    assert t.ended.startswith("running when last written (after step 5): either the run is "
                              "still going, or it was killed")
    assert [f.name for f in render_figures(report)] == [t.slug]
    # a record whose losses or final loss disagree with its steps was cut or edited: refused
    # (an audit: "final loss 7.58" beside "→ 8.37 at step 5" of 20)
    from trainfit.report.json_fields import ReportInputError
    for bad, said in (({"losses": [4.0, 3.5]}, "losses: 2 values for 5 steps"),
                      ({"final_loss": 2.0}, "final_loss: 2 is not the last step's loss (3.25)")):
        (run / "train.json").write_text(json.dumps({**d, **bad}))
        with pytest.raises(ReportInputError, match=re.escape(said)):
            load_inputs([str(run)])
    assert render_figures(report)[0].png.startswith(b"\x89PNG")
    # no evaluation: said so; a non-finite one (train writes NaN / Infinity as they are) is read,
    # not refused (a review)
    d.update(evals=[])
    (run / "train.json").write_text(json.dumps(d))
    (t,) = build_report(load_inputs([str(run)])).trains
    assert dict(train_text(t).rows)["evaluation"].startswith("none recorded (train evaluates")
    d.update(evals=[{"step": 2, "eval_loss": float("nan"), "eval_perplexity": float("inf")}])
    (run / "train.json").write_text(json.dumps(d))
    (t,) = build_report(load_inputs([str(run)])).trains
    assert dict(train_text(t).rows)["evaluation"] == "1 evaluation(s), none finite"


def test_a_small_limits_legend_is_said_in_its_unit():
    """An audit: a 22 MiB --memory-limit's legend read "--memory-limit 0.0 GiB"."""
    from trainfit.report.figures import _limit_text

    assert _limit_text(22 * 2**20 / 2**30, "GiB") == "22 MiB"
    assert _limit_text(1.5, "GiB") == "1.50 GiB" and _limit_text(250.0, "W") == "250.0 W"
