"""train.json's record (run/record.py): what a checkpoint's train.json says while the run goes on,
and what a resume keeps of a checkpoint's history."""

from __future__ import annotations

import json

import pytest

from trainfit.report import build_report, load_inputs
from trainfit.report.tables import loss_words
from trainfit.run.oom import OomEvent
from trainfit.run.record import TrainResult, continue_from, new_result, write_train_json

JOB = {"model": "m", "seq_len": 32, "micro_batch": 4, "grad_accum": 2, "effective_batch": 8}


def _run(steps: int) -> TrainResult:
    res = new_result(JOB, main=True)
    res.begin_segment(0, None, [])
    for i in range(steps):
        res.add_step(5.0 - 0.1 * i, 8, 256, 4, 2)
    return res


def test_the_train_json_written_at_a_checkpoint_holds_the_open_segments_time(tmp_path):
    """20 steps, 4.0 s into the first segment: train.json at the save says 4.0 s, as the
    checkpoint's own snapshot does (a review: it said 0 s beside 5,120 tokens — a killed run's
    report read tokens/s from it as unknown, or 1.4× too high after a resume)."""
    res = _run(20)
    write_train_json(tmp_path, res, open_wall_time_s=4.0)
    d = json.loads((tmp_path / "train.json").read_text())
    assert (d["steps"], d["tokens_seen"], d["wall_time_s"]) == (20, 5120, 4.0)
    assert d["segments"][-1]["wall_time_s"] == 4.0 and d["stopped"] == "running"
    assert res.snapshot(4.0)["wall_time_s"] == 4.0
    # the record itself is untouched: the segment closes at its own time
    assert res.wall_time_s == 0.0 and res.segments[-1]["wall_time_s"] == 0.0
    res.close_segment(5.0, "finished")
    write_train_json(tmp_path, res, open_wall_time_s=99.0)  # a closed segment keeps its time
    assert json.loads((tmp_path / "train.json").read_text())["wall_time_s"] == 5.0
    (t,) = build_report(load_inputs([str(tmp_path / "train.json")])).trains
    assert t.tokens_per_s_measured == pytest.approx(5120 / 5.0)


def test_a_resume_keeps_the_evaluation_oom_of_its_checkpoint_step():
    """checkpoint-2 is saved after step 2's evaluation: that evaluation's OOM split is in it and
    is kept with the evaluation; a training split at step 2 redid step 3, after the checkpoint."""
    history = _run(2).snapshot(1.0)
    history["oom_events"] = [
        OomEvent(step=1, phase="step", batch_before=8, batch_after=4, grad_accum_after=2).to_dict(),
        OomEvent(step=2, phase="eval", batch_before=4, batch_after=2).to_dict(),
        OomEvent(step=2, phase="step", batch_before=4, batch_after=2, grad_accum_after=4).to_dict()]
    history["evals"] = [{"step": 2, "eval_loss": 4.0, "eval_perplexity": 54.6}]
    res = new_result(JOB, main=True)
    continue_from(res, history, step=2, samples=16, tokens_per_sample=32)
    assert [(e.step, e.phase) for e in res.oom_events] == [(1, "step"), (2, "eval")]
    assert [e["step"] for e in res.evals] == [2]


def test_steps_resumed_without_history_are_unrecorded_not_non_finite(tmp_path):
    """A checkpoint of an older trainfit carries no history: its 18 steps have no losses and no
    wall time. The report read 18 'not finite' steps, and tokens of 20 steps ÷ the time of 2
    (1.6× the real rate); now the wall time and tokens/s are unknown, the steps not recorded."""
    res = new_result(JOB, main=True)
    continue_from(res, {}, step=18, samples=144, tokens_per_sample=32)
    res.begin_segment(18, "checkpoint-18", [])
    res.add_step(4.0, 8, 256, 4, 2)
    res.add_step(None, 8, 256, 4, 2)  # a step the fp16 GradScaler skipped
    res.close_segment(0.5, "finished")
    write_train_json(tmp_path, res)
    (t,) = build_report(load_inputs([str(tmp_path / "train.json")])).trains
    assert t.wall_time_s is None and t.tokens_per_s_measured is None
    assert t.unrecorded_steps == 18
    words = loss_words(t.losses, t.unrecorded_steps)
    assert "1 step(s) not finite" in words and "steps 1–18 not recorded" in words
    assert loss_words([None, None, 3.0]) .endswith("2 step(s) not finite (the loss figure draws each)")


def test_a_resume_over_data_of_another_size_is_refused(tmp_path, micro_model_json, chat_jsonl):
    """The position counts the data's samples and the order permutes that many: a resume over
    data that makes another number continued another stream, unsaid (a review)."""
    from trainfit.job import JobError, JobSpec
    from trainfit.run.loop import RunOptions, train

    job = JobSpec(model=str(micro_model_json), seq_len=32, effective_batch=8, micro_batch=4,
                  precision="fp32", data=str(chat_jsonl))
    out = tmp_path / "run"
    res = train(job, RunOptions(out_dir=out, max_steps=2, save_every_steps=2))
    rows = chat_jsonl.read_text().splitlines()
    assert res.data_samples == len(rows)
    assert json.loads((out / "train.json").read_text())["data_samples"] == len(rows)
    fewer = tmp_path / "fewer.jsonl"
    fewer.write_text("\n".join(rows[:-2]) + "\n")
    with pytest.raises(JobError, match=f"makes {len(rows) - 2} training samples, the "
                                       f"checkpoint's run had {len(rows)}"):
        train(job.replace(data=str(fewer)), RunOptions(out_dir=tmp_path / "b", resume=out,
                                                       max_steps=4))
    assert not (tmp_path / "b").exists()


def test_a_resume_over_other_samples_of_the_same_number_is_refused(tmp_path, micro_model_json,
                                                                    chat_jsonl):
    """The same number of samples, another content: the digest tells them apart; the same file
    moved to another path resumes."""
    import shutil

    from trainfit.job import JobError, JobSpec
    from trainfit.run.loop import RunOptions, train

    job = JobSpec(model=str(micro_model_json), seq_len=32, effective_batch=8, micro_batch=4,
                  precision="fp32", data=str(chat_jsonl))
    out = tmp_path / "run"
    res = train(job, RunOptions(out_dir=out, max_steps=2, save_every_steps=2))
    assert len(res.data_sha256 or "") == 64
    rows = chat_jsonl.read_text().splitlines()
    other = tmp_path / "other.jsonl"
    other.write_text("\n".join([rows[1], rows[0], *rows[2:]]) + "\n")  # two rows swapped
    with pytest.raises(JobError, match="are not the ones the checkpoint's run trained on"):
        train(job.replace(data=str(other)), RunOptions(out_dir=tmp_path / "b", resume=out,
                                                       max_steps=4))
    moved = tmp_path / "moved.jsonl"
    shutil.copy(chat_jsonl, moved)
    done = train(job.replace(data=str(moved)), RunOptions(out_dir=tmp_path / "c", resume=out,
                                                          max_steps=4))
    assert done.steps == 4


def test_an_evaluation_without_a_number_is_written_as_null_in_strict_json(tmp_path):
    """No label tokens in the eval set: no loss; an overflowing exp: no perplexity. train.json was
    written with NaN / Infinity (an audit), which strict parsers (jq, JSON.parse) refuse."""
    import time

    import torch

    from trainfit.engine.dist import Dist
    from trainfit.run import evaluate as ev

    empty = ev._result([], [], 0, Dist(), step=2, batch=4, t0=time.perf_counter(), events=[])
    assert (empty.eval_loss, empty.eval_perplexity, empty.tokens) == (None, None, 0)
    huge = ev._result([torch.tensor(1000.0)], [3], 1, Dist(), step=4, batch=4,
                      t0=time.perf_counter(), events=[])
    assert (huge.eval_loss, huge.eval_perplexity, huge.tokens) == (1000.0, None, 3)
    res = _run(4)
    res.evals += [empty.to_dict(), huge.to_dict(), {"step": 5, "eval_loss": float("nan"),
                                                    "eval_perplexity": float("inf")}]

    def refuse(name: str) -> None:
        raise AssertionError(f"train.json holds {name}")

    write_train_json(tmp_path, res)
    d = json.loads((tmp_path / "train.json").read_text(), parse_constant=refuse)
    assert [(e["eval_loss"], e["eval_perplexity"]) for e in d["evals"]] == [
        (None, None), (1000.0, None), (None, None)]
    (t,) = build_report(load_inputs([str(tmp_path / "train.json")])).trains
    assert [e.eval_loss for e in t.evals] == [None, 1000.0, None]


def test_the_summary_says_why_an_evaluation_has_no_loss(capsys):
    """A review: a non-finite loss over label tokens read "unknown (no label tokens)" beside
    "90 label tokens"."""
    from trainfit.render.train import render_train

    res = _run(2)
    res.close_segment(1.0, "finished")
    ev = {"eval_batch": 2, "eval_time_s": 0.1}
    res.evals += [{"step": 1, "eval_loss": None, "eval_perplexity": None, "samples": 0,
                   "tokens": 0, **ev},
                  {"step": 2, "eval_loss": None, "eval_perplexity": None, "samples": 3,
                   "tokens": 90, **ev},
                  {"step": 3, "eval_loss": 700.0, "eval_perplexity": None, "samples": 3,
                   "tokens": 90, **ev}]
    render_train(res.to_dict(), "out")
    lines = [x for x in capsys.readouterr().out.splitlines() if x.startswith("eval at step")]
    assert lines[0].startswith("eval at step 1: loss unknown (no label tokens) (measured), "
                               "perplexity unknown")
    assert lines[1].startswith("eval at step 2: loss not finite (measured), perplexity unknown")
    assert lines[2].startswith("eval at step 3: loss 700.0000 (measured), perplexity overflows")


def test_the_summary_says_a_resume_at_another_micro_batch(capsys):
    """An audit: a resume at micro-batch 2 × 4 after 8 × 1 was said only in train.json."""
    from trainfit.render.train import render_train

    res = new_result(JOB, main=True)

    def segment(step: int, micro: int, accum: int, stopped: str) -> str:
        """One segment of one step at ``micro`` × ``accum``; the summary's "this run:" line."""
        res.begin_segment(step, f"run/checkpoint-{step}" if step else None, [])
        res.add_step(5.0 - 0.1 * step, 8, 256, micro, accum)
        res.close_segment(1.0, stopped)
        render_train(res.to_dict(), "run")
        return next((x for x in capsys.readouterr().out.splitlines()
                     if x.startswith("this run:")), "")

    segment(0, 8, 1, "interrupted")
    line = segment(1, 2, 4, "finished")
    assert line.endswith("resumed from run/checkpoint-1, at 2 × 4 (the run before: 8 × 1)")
    # the same micro-batch: nothing more said
    line = segment(2, 2, 4, "finished")
    assert line.endswith("resumed from run/checkpoint-2")


def test_a_resume_over_a_held_out_runs_data_names_the_hold_out():
    """An audit: resuming an --eval-fraction run with --eval-data blamed the data ("resume over
    the data it trained on"); the run held out a share, which another evaluation set changes."""
    from trainfit.job import JobError
    from trainfit.run.resume_fields import same_data

    data = type("D", (), {"__len__": lambda self: 40, "digest": lambda self: "x"})()
    history = {"data_samples": 30, "run_options": {"eval_fraction": 0.25}}
    with pytest.raises(JobError, match=r"held out --eval-fraction 0.25") as err:
        same_data("run/checkpoint-4", history, data)
    assert err.value.hint.startswith("resume without --eval-data")
    with pytest.raises(JobError, match=r"checkpoint's run had 30: its position counts those$"):
        same_data("run/checkpoint-4", {"data_samples": 30}, data)
