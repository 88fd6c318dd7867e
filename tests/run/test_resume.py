"""train --resume: the run goes on as if never stopped (schedule, samples, dropout, options), and a
resume that would not be that run is refused or said (fp32, CPU)."""

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from trainfit.cli.main import app
from trainfit.job import JobError, JobSpec
from trainfit.run.loop import RunOptions, train

runner = CliRunner()


def test_a_resume_without_a_length_keeps_the_checkpoints_schedule(job, tmp_path):
    """QA: the README's `--resume run --micro-batch 2` without --max-steps went on to the epoch's
    end and rebuilt the linear decay over it: the losses left the uninterrupted run's at the
    next step, with nothing said. The checkpoint records its run's length; a resume that gives
    none keeps it, one that gives another says the schedule changed."""
    ref = train(job, RunOptions(out_dir=tmp_path / "ref", max_steps=5))
    train(job, RunOptions(out_dir=tmp_path / "a", max_steps=5, inject_interrupt_at_step=2))
    ck = json.loads((tmp_path / "a" / "checkpoint-3" / "trainer_state.json").read_text())
    assert ck["schedule_steps"] == 5
    b = train(job.replace(micro_batch=2), RunOptions(out_dir=tmp_path / "a", resume=tmp_path / "a"))
    assert b.steps == 5 and b.losses == pytest.approx(ref.losses, rel=1e-6)
    assert not any("decays to 0" in n for s in b.segments for n in s.get("notes", []))
    c = train(job, RunOptions(out_dir=tmp_path / "c", max_steps=7,
                              resume=tmp_path / "a" / "checkpoint-3"))
    said = [n for s in c.segments for n in s.get("notes", []) if "decays to 0" in n]
    assert said and "at step 7, not at the checkpoint's 5: from step 5 on, the updates" in said[0]
    # step 4 runs at the rate the checkpoint's optimizer state carries: its update is the
    # uninterrupted run's, so the loss after it (step 5's) is too
    assert c.losses[:5] == pytest.approx(ref.losses[:5], rel=1e-6)
    # the finished run resumed with no length keeps its own, which ended there: refused
    # resumed in its own directory from an older checkpoint: the later ones are said
    s = train(job, RunOptions(out_dir=tmp_path / "s", max_steps=4, save_every_steps=2))
    assert [Path(p).name for p in s.checkpoints] == ["checkpoint-2", "checkpoint-4"]
    r = train(job, RunOptions(out_dir=tmp_path / "s", resume=tmp_path / "s" / "checkpoint-2"))
    assert any(n.startswith("checkpoint-4 in ") and "replaced when this run saves" in n
               for n in r.segments[-1]["notes"])
    assert r.losses == pytest.approx(s.losses, rel=1e-6)
    with pytest.raises(JobError, match=r"the run that wrote .*checkpoint-5 \(its length, 5 steps\)"
                       r".*already at step 5: no step is left"):
        train(job, RunOptions(out_dir=tmp_path / "a", resume=tmp_path / "a"))


def test_resume_keeps_a_finished_segment_and_refuses_another_sample_stream(job, tmp_path):
    """A run that finished at its checkpoint keeps 'finished' and its whole wall time when it is
    resumed (train.json, written after the checkpoint, is the record); a resume that changes
    what a sample is (seq_len) is refused with the fix; the record names the micro-batch each
    segment ran at."""
    out = tmp_path / "r"
    first = train(job, RunOptions(out_dir=out, max_steps=2))
    d1 = json.loads((out / "train.json").read_text())
    assert d1["segments"][0]["stopped"] == "finished"
    assert d1["segments"][0]["micro_batch"] == 4 and d1["segments"][0]["grad_accum"] == 2
    assert d1["job"]["grad_ckpt"] == "off"  # left to be chosen: ran without, recorded so
    with pytest.raises(JobError, match="seq_len 64 differs from the checkpoint's 32") as info:
        train(job.replace(seq_len=64), RunOptions(out_dir=out, max_steps=3, resume=out))
    assert "resume with seq_len: 32" in info.value.hint
    # chat rows are not packed: the run records packing false (what the data layer did), so a
    # packed resume is another stream, while spelling out false is the same one
    assert d1["job"]["packing"] is False
    with pytest.raises(JobError, match="packing True differs from the checkpoint's False") as info:
        train(job.replace(packing=True), RunOptions(out_dir=out, max_steps=3, resume=out))
    assert "resume with packing: false" in info.value.hint
    again = train(job.replace(micro_batch=2, packing=False),
                  RunOptions(out_dir=out, max_steps=3, resume=out))
    seg0 = again.segments[0]
    assert seg0["stopped"] == "finished" and seg0["notes"] == d1["segments"][0]["notes"]
    assert seg0["wall_time_s"] == pytest.approx(d1["segments"][0]["wall_time_s"])
    assert again.wall_time_s >= first.wall_time_s
    assert [(s["micro_batch"], s["grad_accum"]) for s in again.segments] == [(4, 2), (2, 4)]
    # where each segment ran, which report labels the monitor log by (an audit)
    assert [(s["device"], s["memory_limit_bytes"]) for s in again.segments] == [("cpu", None)] * 2
    assert all(0 < s["monitor_cpu_s"] < s["wall_time_s"] for s in again.segments)


def test_a_resume_counts_the_checkpoints_optimizer_states_against_the_limit(
        job, tmp_path, limit_between):
    """The optimizer states a resume loads exist before the first step: the CPU limit counted
    only the weights, so a resumed run fitted micro-batch 4 under a limit the fresh run split at
    (an audit: a halved measured peak after every resume)."""
    limit = limit_between(job, fits=2, ooms=4)
    fresh = train(job, RunOptions(out_dir=tmp_path / "f", max_steps=3, memory_limit_bytes=limit))
    assert [e.to_dict()["micro_batch_after"] for e in fresh.oom_events] == [2]
    a = train(job.replace(micro_batch=2), RunOptions(out_dir=tmp_path / "a", max_steps=3,
                                                      inject_interrupt_at_step=0))
    assert a.interrupted and a.steps == 1
    b = train(job, RunOptions(out_dir=tmp_path / "a", max_steps=3, resume=tmp_path / "a",
                              memory_limit_bytes=limit))
    assert [(e.step, e.to_dict()["micro_batch_after"]) for e in b.oom_events] == [(1, 2)]
    assert b.losses == pytest.approx(fresh.losses, rel=1e-6)


def test_training_on_from_a_finished_run_takes_the_new_schedules_rate_at_once(job, tmp_path):
    """A finished run's checkpoint carries linear decay's last rate, 0: the first step of a
    longer resume changed no weight and was reported trained (an audit). It takes the new
    schedule's rate, and the note says so."""
    from safetensors.torch import load_file

    train(job, RunOptions(out_dir=tmp_path / "r", max_steps=3))
    on = train(job, RunOptions(out_dir=tmp_path / "r", resume=tmp_path / "r", max_steps=6,
                               save_every_steps=1))
    assert on.steps == 6
    w3 = load_file(str(tmp_path / "r" / "checkpoint-3" / "model.safetensors"))
    w4 = load_file(str(tmp_path / "r" / "checkpoint-4" / "model.safetensors"))
    assert max((w4[k] - w3[k]).abs().max().item() for k in w3) > 0
    st = json.loads((tmp_path / "r" / "checkpoint-4" / "trainer_state.json").read_text())
    notes = [n for s in on.segments for n in s.get("notes", [])]
    assert any("the checkpoint's run ended at step 3" in n and "from 50% of lr at step 4 to 0 "
               "at step 6" in n for n in notes), notes
    assert st  # the checkpoint was written whole


def test_keep_last_removes_the_older_checkpoints_and_resumes(job, tmp_path):
    """--keep-last N (HF's save_total_limit): after each save only the newest N checkpoints stay;
    the record lists those, a cut prune's leftovers go at the next start, and the run resumes
    from what is kept."""
    ref = train(job, RunOptions(out_dir=tmp_path / "ref", max_steps=5))
    a = train(job, RunOptions(out_dir=tmp_path / "a", max_steps=5, save_every_steps=1,
                              keep_last=2, inject_interrupt_at_step=3))
    assert sorted(p.name for p in (tmp_path / "a").glob("checkpoint-*")) == [
        "checkpoint-3", "checkpoint-4"]
    assert [Path(c).name for c in a.checkpoints] == ["checkpoint-3", "checkpoint-4"]
    (tmp_path / "a" / ".checkpoint-1.removing").mkdir()  # a prune cut by a kill
    b = train(job, RunOptions(out_dir=tmp_path / "a", resume=tmp_path / "a", max_steps=5,
                              save_every_steps=1, keep_last=2))
    assert b.losses == pytest.approx(ref.losses, rel=1e-6)
    assert sorted(p.name for p in (tmp_path / "a").iterdir() if "checkpoint" in p.name) == [
        "checkpoint-4", "checkpoint-5"]
    with pytest.raises(JobError, match="--keep-last 0: must be ≥ 1"):
        RunOptions(out_dir=tmp_path / "c", keep_last=0)
    # a run killed after its checkpoint resumes from the checkpoint's snapshot, whose list named
    # checkpoints a prune removed since: the record lists what is there (a review)
    d = json.loads((tmp_path / "a" / "train.json").read_text())
    d["segments"][-1]["stopped"] = None
    (tmp_path / "a" / "train.json").write_text(json.dumps(d))
    c = train(job, RunOptions(out_dir=tmp_path / "a", resume=tmp_path / "a", max_steps=7,
                              save_every_steps=1, keep_last=1))
    assert [Path(p).name for p in c.checkpoints] == ["checkpoint-7"]
    # resumed from an older checkpoint, the later ones of the run it left are not this run's
    # newest: its own stay (a review: they counted among the newest and this run's went)
    s = train(job, RunOptions(out_dir=tmp_path / "s", max_steps=4, save_every_steps=1))
    assert len(s.checkpoints) == 4
    r = train(job, RunOptions(out_dir=tmp_path / "s", resume=tmp_path / "s" / "checkpoint-1",
                              save_every_steps=1, keep_last=2, inject_interrupt_at_step=1))
    assert r.steps == 2
    assert sorted(p.name for p in (tmp_path / "s").glob("checkpoint-*")) == [
        "checkpoint-1", "checkpoint-2", "checkpoint-3", "checkpoint-4"]


def test_a_moved_run_directory_lists_its_own_checkpoints(job, tmp_path):
    """An audit: a run directory moved (mv1 → mv2), then resumed with --keep-last 1, listed
    ['mv1/checkpoint-3', 'mv1/checkpoint-6', …, 'mv2/checkpoint-8'] where only checkpoint-8
    was left; the record lists what is there, under the directory it is in now."""
    import shutil

    train(job, RunOptions(out_dir=tmp_path / "mv1", max_steps=6, save_every_steps=3))
    shutil.move(tmp_path / "mv1", tmp_path / "mv2")
    b = train(job, RunOptions(out_dir=tmp_path / "mv2", resume=tmp_path / "mv2", max_steps=8,
                              keep_last=1))
    assert b.checkpoints == [str(tmp_path / "mv2" / "checkpoint-8")]
    on_disk = json.loads((tmp_path / "mv2" / "train.json").read_text())["checkpoints"]
    assert on_disk == b.checkpoints
    # without --keep-last the moved run's earlier checkpoints are listed where they are now
    shutil.move(tmp_path / "mv2", tmp_path / "mv3")
    c = train(job, RunOptions(out_dir=tmp_path / "mv3", resume=tmp_path / "mv3", max_steps=9))
    assert c.checkpoints == [str(tmp_path / "mv3" / f"checkpoint-{n}") for n in (8, 9)]


def test_a_resume_keeps_the_runs_evaluation_and_checkpoint_options(job, tmp_path):
    """An audit: a resume without --eval-fraction was refused as "the data makes 305 training
    samples, the checkpoint's run had 274" (the held-out share is what differed), and with it,
    --eval-every and --save-every were dropped silently. The run's options are in its record and
    kept unless given again, each said."""
    p = tmp_path / "job.yaml"
    p.write_text(yaml.safe_dump(job.to_dict()))
    out = tmp_path / "run"
    runner = CliRunner()
    first = runner.invoke(app, ["train", str(p), "--out", str(out), "--max-steps", "2",
                                "--eval-fraction", "0.25", "--eval-every", "1",
                                "--save-every", "1", "--no-live", "--json"])
    assert first.exit_code == 0, first.output
    assert json.loads((out / "train.json").read_text())["run_options"] == {
        "save_every_steps": 1, "eval_fraction": 0.25, "eval_every_steps": 1}
    # a resume refused (its --max-steps is the checkpoint's step) says the refusal alone: the
    # options it would have kept were said before it (a review)
    refused = runner.invoke(app, ["train", str(p), "--out", str(out), "--resume", str(out),
                                  "--max-steps", "2", "--no-live"])
    assert refused.exit_code == 2, refused.output
    assert "kept from the run being resumed" not in refused.stderr
    assert "--max-steps 2" in refused.stderr
    again = runner.invoke(app, ["train", str(p), "--out", str(out), "--resume", str(out),
                                "--max-steps", "3", "--no-live", "--json"])
    assert again.exit_code == 0, again.output
    seg = json.loads((out / "train.json").read_text())["segments"][-1]
    assert "--save-every 1 kept from the run being resumed (give --save-every to change it)" \
        in seg["notes"]
    assert "--eval-fraction 0.25 kept from the run being resumed" in again.stderr
    assert "--eval-every 1 kept" in again.stderr and "--save-every 1 kept" in again.stderr
    d = json.loads((out / "train.json").read_text())
    assert [e["step"] for e in d["evals"]] == [1, 2, 3]
    assert [Path(c).name for c in d["checkpoints"]] == ["checkpoint-1", "checkpoint-2",
                                                         "checkpoint-3"]
    # said once: the summary leaves out what was said as the run began (an audit: twice)
    more = runner.invoke(app, ["train", str(p), "--out", str(out), "--resume", str(out),
                               "--max-steps", "4", "--no-live"])
    assert more.exit_code == 0, more.output
    assert more.output.count("--save-every 1 kept from the run being resumed") == 1


def test_a_resume_says_a_changed_setting_and_refuses_another_model_config(job, tmp_path):
    """An audit: a resume changed precision and clipping silently (train.json then gave the new
    values for the whole run), and trained on over a config with another rope_theta and norm
    epsilon (the same shapes), the loss jumping. Now each setting is said and kept per segment;
    another configuration is refused."""
    out = tmp_path / "run"
    train(job, RunOptions(out_dir=out, max_steps=2))
    res = train(job.replace(precision="amp-bf16", max_grad_norm=0.5),
                RunOptions(out_dir=out, max_steps=3, resume=out))
    seg = res.segments
    assert (seg[0]["precision"], seg[0]["max_grad_norm"]) == ("fp32", job.max_grad_norm)
    assert (seg[1]["precision"], seg[1]["max_grad_norm"]) == ("amp-bf16", 0.5)
    assert "precision: 'amp-bf16' from this segment on (the checkpoint's run had 'fp32')" \
        in seg[1]["notes"]
    assert any(n.startswith("max_grad_norm: 0.5 from this segment on") for n in seg[1]["notes"])
    # the same shapes, another function: refused, nothing written
    other = tmp_path / "rope" / "config.json"
    other.parent.mkdir()
    cfg = json.loads(Path(job.model).read_text())
    other.write_text(json.dumps({**cfg, "rope_theta": 500000.0, "rms_norm_eps": 1e-3}))
    with pytest.raises(JobError, match=r"the model's configuration differs from the "
                                       r"checkpoint's run: rms_norm_eps 0\.001 \(was 1e-06\), "
                                       r"rope_parameters \{'rope_theta': 500000\.0"):
        train(job.replace(model=str(other)), RunOptions(out_dir=out, max_steps=4, resume=out))
    # the same config at another path resumes
    same = tmp_path / "same" / "config.json"
    same.parent.mkdir()
    same.write_text(Path(job.model).read_text())
    assert train(job.replace(model=str(same)), RunOptions(out_dir=out, max_steps=4,
                                                          resume=out)).steps == 4


def test_a_resume_with_dropout_is_exact(job, tmp_path):
    """An audit: ``iter(DataLoader)`` draws its base seed from torch's global generator, and a
    resume makes a loader where the uninterrupted run did not: every LoRA dropout mask after it
    moved (losses off by up to 1e-3).  The draw is put back: the resumed losses are the
    uninterrupted run's to the bit."""
    lora = job.replace(method="lora", lora_dropout=0.1)
    ref = train(lora, RunOptions(out_dir=tmp_path / "ref", max_steps=6))
    train(lora, RunOptions(out_dir=tmp_path / "a", max_steps=6, inject_interrupt_at_step=2))
    b = train(lora, RunOptions(out_dir=tmp_path / "a", resume=tmp_path / "a"))
    assert b.steps == 6 and b.losses == ref.losses


def test_a_resume_with_another_method_names_it(job, tmp_path):
    """An audit: lora resumed from a full fine-tune's checkpoint read "belongs to another
    model"; the job field that changed the trainable tensors is named."""
    train(job, RunOptions(out_dir=tmp_path / "f", max_steps=1))
    with pytest.raises(JobError, match=r"trainable tensors differ in names or shapes from this "
                       r"job's \(method: full → lora\)") as err:
        train(job.replace(method="lora"), RunOptions(out_dir=tmp_path / "l", max_steps=2,
                                                     resume=tmp_path / "f"))
    assert "into a new --out" in err.value.hint


def test_a_resume_without_out_continues_in_the_resumed_runs_directory(job, tmp_path,
                                                                      monkeypatch):
    """An audit: an interrupt printed "resume with --resume B", which went on into
    ./trainfit-run; and a review: a checkpoint copied under another name ("best") must not be
    taken for the run directory."""
    import shutil

    monkeypatch.chdir(tmp_path)
    p = tmp_path / "job.yaml"
    p.write_text(yaml.safe_dump(job.to_dict()))
    train(job, RunOptions(out_dir=tmp_path / "B", max_steps=4, inject_interrupt_at_step=1))
    res = runner.invoke(app, ["train", str(p), "--resume", str(tmp_path / "B")])
    assert res.exit_code == 0, res.output
    assert (tmp_path / "B" / "checkpoint-4").exists() and not (tmp_path / "trainfit-run").exists()
    # a checkpoint under another name: its parent is the run directory
    train(job, RunOptions(out_dir=tmp_path / "C", max_steps=4, inject_interrupt_at_step=1))
    shutil.copytree(tmp_path / "C" / "checkpoint-2", tmp_path / "C" / "best")
    res = runner.invoke(app, ["train", str(p), "--resume", str(tmp_path / "C" / "best")])
    assert res.exit_code == 0, res.output
    assert (tmp_path / "C" / "checkpoint-4").exists()




def test_resume_of_a_run_killed_before_its_first_save_says_the_same_out_works(tmp_path):
    """An audit: ``--resume`` of a run killed before its first checkpoint (no record written)
    said "into a new --out (or remove it first)", where running into the same --out works (the
    dead run's monitor files are set aside); a run that recorded steps keeps the old hint."""
    from trainfit.run import checkpoint as ckpt

    run = tmp_path / "run"
    run.mkdir()
    (run / "monitor.jsonl").write_text("{}\n")
    with pytest.raises(JobError, match="no complete checkpoint") as err:
        ckpt.find(run)
    assert f"into the same --out {run}" in err.value.hint
    (run / "train.json").write_text("{}")
    with pytest.raises(JobError) as err:
        ckpt.find(run)
    assert "into a new --out" in err.value.hint


def test_a_checkpoint_from_before_the_decay_was_recorded_ran_without_one():
    """A checkpoint's job written before weight_decay / sgd_momentum existed ran with 0.0 / 0.9:
    its optimizer state puts them back, so another is refused, not skipped (a review)."""
    from trainfit.run.resume_fields import same_samples

    saved = {k: v for k, v in JobSpec(model="t").to_dict().items()
             if k not in ("weight_decay", "sgd_momentum")}
    same_samples("ck", saved, JobSpec(model="t").to_dict())  # the same: resumes
    with pytest.raises(JobError, match=r"weight_decay 0\.1 differs from the checkpoint's 0\.0"):
        same_samples("ck", saved, JobSpec(model="t", weight_decay=0.1).to_dict())
    sgd = {**saved, "optimizer": "sgd"}
    with pytest.raises(JobError, match=r"sgd_momentum 0\.0 differs from the checkpoint's 0\.9"):
        same_samples("ck", sgd, JobSpec(model="t", optimizer="sgd", sgd_momentum=0.0).to_dict())
