"""train: OOM and interruption cost no sample and change no loss (fp32, CPU)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from trainfit.cli.main import app
from trainfit.job import JobError
from trainfit.run.loop import RunOptions, train

runner = CliRunner()


def _flat(res):
    return [i for step in res.samples for i in step]


def test_oom_and_interrupt_lose_nothing(job, tmp_path):
    ref = train(job, RunOptions(out_dir=tmp_path / "ref", max_steps=6, record_samples=True))
    a = train(job, RunOptions(out_dir=tmp_path / "a", max_steps=6, record_samples=True,
                              inject_oom_at_steps=(1,), inject_interrupt_at_step=3))
    assert a.interrupted and a.steps == 4
    assert [e.to_dict() for e in a.oom_events] == [{"step": 1, "phase": "step", "micro_batch_before": 4,
                             "micro_batch_after": 2, "grad_accum_after": 4}]
    # resume at another micro-batch (same effective batch)
    b = train(job.replace(micro_batch=1), RunOptions(out_dir=tmp_path / "a", max_steps=6,
                                                      resume=tmp_path / "a", record_samples=True))
    assert b.resumed_from.endswith("checkpoint-4")
    # the resumed run's record holds every step of both segments
    assert b.losses == pytest.approx(ref.losses, rel=1e-6) and b.losses[:4] == a.losses
    assert [(s["start_step"], s["end_step"]) for s in b.segments] == [(0, 4), (4, 6)]
    assert b.samples_seen == 48 and b.steps == 6 and b.exit_code == 0
    # every sample consumed exactly once, in the same steps
    assert [sorted(s) for s in a.samples + b.samples] == [sorted(s) for s in ref.samples]
    seen = _flat(ref)
    assert len(seen) == 48 and len(set(seen[:24])) == 24  # 24 samples: 2 epochs, none repeated


def test_a_split_or_another_micro_batch_with_dropout_says_the_losses_are_not_step_for_step(
        job, tmp_path):
    """An audit: with dropout (LoRA's default 0.05) an OOM split moved the losses by 2e-3 and a
    resume at another micro-batch by 1e-2 while the README promised the uninterrupted run's —
    the masks are drawn per micro-batch, for its shape.  Said in the run's notes, once; not
    said without dropout (the test above: equal losses)."""
    plain = train(job, RunOptions(out_dir=tmp_path / "p", max_steps=3, inject_oom_at_steps=(1,)))
    assert not any(n.startswith("dropout") for n in plain.notes)
    lora = job.replace(method="lora", lora_dropout=0.1)
    a = train(lora, RunOptions(out_dir=tmp_path / "a", max_steps=4, inject_oom_at_steps=(1, 2),
                               inject_interrupt_at_step=2))
    said = [n for n in a.notes if n.startswith("dropout (p = 0.1): after the split at step 2")]
    assert len(said) == 1 and "micro-batches of 2" in said[0] and len(a.oom_events) == 2
    # the checkpoint ran at 1 (two splits); a resume at 4 draws other masks again
    b = train(lora, RunOptions(out_dir=tmp_path / "a", max_steps=4, resume=tmp_path / "a"))
    assert any("this resume at micro-batch 4 (the checkpoint ran 1)" in n
               for n in b.segments[-1]["notes"])


def test_real_memory_limit_oom_splits(job, tmp_path, limit_between):
    limit = limit_between(job, fits=2, ooms=4)
    ref = train(job.replace(micro_batch=2), RunOptions(out_dir=tmp_path / "r", max_steps=3))
    res = train(job, RunOptions(out_dir=tmp_path / "m", max_steps=3, memory_limit_bytes=limit))
    assert [e["micro_batch_after"] for e in (x.to_dict() for x in res.oom_events)] == [2]
    assert res.losses == pytest.approx(ref.losses, rel=1e-6)


def test_checkpoint_files_and_bad_resume(job, tmp_path, micro_model_json):
    res = train(job, RunOptions(out_dir=tmp_path / "c", max_steps=2, save_every_steps=1))
    ck = Path(res.checkpoints[-1])
    assert {p.name for p in ck.iterdir()} >= {"model.safetensors", "optimizer.pt", "scheduler.pt",
                                              "rng.pt", "trainer_state.json"}
    assert json.loads((ck / "trainer_state.json").read_text())["position"] == 16
    d = json.loads((tmp_path / "c" / "train.json").read_text())
    assert d["kind"] == "train" and d["steps"] == 2 and d["samples_seen"] == 16
    # another model's checkpoint
    other = json.loads(Path(micro_model_json).read_text())
    other["hidden_size"] = 32
    o = tmp_path / "other" / "config.json"
    o.parent.mkdir()
    o.write_text(json.dumps(other))
    with pytest.raises(JobError, match="another model"):
        train(job.replace(model=str(o)), RunOptions(out_dir=tmp_path / "x", max_steps=3,
                                                    resume=tmp_path / "c"))
    # a corrupt one
    (ck / "optimizer.pt").write_bytes(b"garbage")
    before = (ck / "model.safetensors").read_bytes()
    with pytest.raises(JobError, match=r"optimizer\.pt: damaged") as info:
        train(job, RunOptions(out_dir=tmp_path / "c", max_steps=3, resume=ck))
    assert "--resume " + str(tmp_path / "c" / "checkpoint-1") in info.value.hint
    assert (ck / "model.safetensors").read_bytes() == before  # nothing overwritten


def test_cli_train_bad_input(job, tmp_path):
    p = tmp_path / "job.yaml"
    d = job.to_dict()
    d["micro_bacth"] = 2
    p.write_text(yaml.safe_dump(d))
    res = runner.invoke(app, ["train", str(p), "--out", str(tmp_path / "o")])
    assert res.exit_code == 2 and "did you mean 'micro_batch'" in res.output
    d.pop("micro_bacth")
    p.write_text(yaml.safe_dump(d))
    res = runner.invoke(app, ["train", str(p), "--resume", str(tmp_path / "nope")])
    assert res.exit_code == 2 and "does not exist" in res.output
    res = runner.invoke(app, ["train", str(p), "--nproc", "999"])
    assert res.exit_code == 2 and "--nproc 999" in res.output
    # a tuned file's memory_limit is the CPU run's stand-in capacity (as tune keeps it); a bad
    # one is refused before anything is written
    lim = tmp_path / "lim.yaml"
    lim.write_text(yaml.safe_dump({**d, "memory_limit": "lots"}))
    res = runner.invoke(app, ["train", str(lim), "--out", str(tmp_path / "lim")])
    assert res.exit_code == 2 and "memory_limit lots" in res.output
    assert not (tmp_path / "lim").exists()
    lim.write_text(yaml.safe_dump({**d, "memory_limit": "1000B"}))
    res = runner.invoke(app, ["train", str(lim), "--out", str(tmp_path / "lim"), "--max-steps", "1"])
    assert res.exit_code == 2 and "the model's weights alone take" in res.output
    res = runner.invoke(app, ["train", str(p), "--out", str(tmp_path / "ok"), "--max-steps", "2",
                              "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["steps"] == 2
    # not a terminal: one progress line on stderr at the first step and at the last
    lines = [ln for ln in res.stderr.splitlines() if ln.startswith("step ")]
    assert lines[0].startswith("step 1/2 ") and lines[-1].startswith("step 2/2 (100 %)")
    assert "tokens/s" in lines[-1] and "ETA" in lines[-1]


def test_real_sigint_checkpoints_and_resumes(job, tmp_path):
    """A real SIGINT (Ctrl-C) mid-run: the step finishes, a checkpoint is written, exit is clean,
    and --resume continues from it."""
    import signal
    import time

    p = tmp_path / "job.yaml"
    p.write_text(yaml.safe_dump(job.to_dict()))
    out = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "trainfit.cli.main", "train", str(p), "--out",
                             str(out), "--max-steps", "100000", "--no-live", "--json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    log = out / "monitor.jsonl"
    deadline = time.time() + 120
    while time.time() < deadline:
        if log.exists() and any((json.loads(x).get("step") or 0) >= 2
                                for x in log.read_text().splitlines() if x.strip()):
            break
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stderr[-2000:]  # interrupted by SIGINT, checkpoint saved
    d = json.loads(stdout)
    assert d["interrupted"] and d["steps"] >= 2 and d["signal"] == "SIGINT"
    ck = Path(d["checkpoints"][-1])
    assert ck.name == f"checkpoint-{d['steps']}"
    res = train(job, RunOptions(out_dir=out, max_steps=d["steps"] + 1, resume=out))
    assert res.steps == d["steps"] + 1 and len(res.losses) == d["steps"] + 1
    assert res.segments[-1]["steps"] == 1 and res.losses[:-1] == d["losses"]


def test_optimizer_in_backward_trains_the_same_losses_and_resumes(job, tmp_path):
    """The step fused into the backward gives the ordinary step's losses (AdamW, no clipping, one
    micro-batch per step), and its optimizer state checkpoints and resumes to the same losses."""
    plain = job.replace(micro_batch=8, grad_accum=1, max_grad_norm=None)
    fused = plain.replace(optimizer_in_backward=True)
    ref = train(plain, RunOptions(out_dir=tmp_path / "ref", max_steps=4))
    got = train(fused, RunOptions(out_dir=tmp_path / "f", max_steps=4))
    assert got.losses == pytest.approx(ref.losses, rel=1e-6, abs=1e-7) and len(got.losses) == 4
    saved = train(fused, RunOptions(out_dir=tmp_path / "h", max_steps=4, save_every_steps=2))
    ck = next(Path(c) for c in saved.checkpoints if Path(c).name == "checkpoint-2")
    rest = train(fused, RunOptions(out_dir=tmp_path / "h2", max_steps=4, resume=ck))
    assert rest.losses[-2:] == pytest.approx(ref.losses[-2:], rel=1e-6, abs=1e-7)


def test_a_busy_host_fits_torchs_threads_and_says_so(job, tmp_path, monkeypatch):
    """Beside a busy neighbour train runs torch at the cores left free, as tune's probes do (it
    kept 2 threads and ran 4x slower than quiet, saying nothing: a QA run); the run says so."""
    import torch

    import trainfit.run.loop as loop

    before = torch.get_num_threads()
    seen = []

    def busy(window_s):
        seen.append(window_s)
        return 1, before, 1.4, 2

    def busy_and_fitted(window_s):
        torch.set_num_threads(1)  # as threads_for_load does
        return busy(window_s)

    monkeypatch.setattr(loop, "threads_for_load", busy_and_fitted)
    res = train(job, RunOptions(out_dir=tmp_path / "r", max_steps=1))
    assert seen == [0.25]
    assert torch.get_num_threads() == before  # given back after the run
    (note,) = [n for n in res.notes if "other processes used 1.4 of 2 CPU cores" in n]
    assert f"torch runs at 1 thread instead of {before}" in note
    record = json.loads((tmp_path / "r" / "train.json").read_text())
    assert note in record["notes"]


def test_an_oom_at_micro_batch_1_says_what_this_job_can_still_change(job, tmp_path):
    """After the splits 4 → 2 → 1 the hint offers the job file's fields this job can change:
    checkpointing (the tiny HF model has it), LoRA for a full fine-tune, QLoRA not on a CPU."""
    with pytest.raises(JobError) as e:
        train(job, RunOptions(out_dir=tmp_path / "r", max_steps=4, inject_oom_at_steps=(0, 1, 2)))
    assert "with micro-batch 1 (after splitting micro-batch 4 → 2 → 1)" in str(e.value)
    hint = e.value.hint
    assert hint.startswith("in the job file: grad_ckpt: full, method: lora, or a shorter seq_len "
                           "(now 32)")
    assert "qlora" not in hint and "--grad-ckpt" not in hint and "into a new --out" in hint
    # checkpointed already, and LoRA: only the sequence is left
    with pytest.raises(JobError) as e:
        train(job.replace(grad_ckpt="full", method="lora"),
              RunOptions(out_dir=tmp_path / "l", max_steps=4, inject_oom_at_steps=(0, 1, 2)))
    assert e.value.hint.startswith("in the job file: a shorter seq_len (now 32)")


def test_an_oom_in_the_optimizer_step_stops_instead_of_redoing_it(job, tmp_path, monkeypatch):
    """An audit: an OOM in the update was split and redone like an activation's, after a
    foreach AdamW had already written part of its states (the losses drifted by 0.048), or died
    in GradScaler's second ``unscale_``.  Its memory does not shrink with the micro-batch: the
    run stops with what lowers it, and its last checkpoint is the state before the step."""
    import torch

    real = torch.optim.AdamW.step
    calls = {"n": 0}

    def step(self, *a, **k):
        calls["n"] += 1
        if calls["n"] == 3:  # the third update: two steps are done and checkpointed
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 MiB")
        return real(self, *a, **k)

    monkeypatch.setattr(torch.optim.AdamW, "step", step)
    with pytest.raises(JobError, match=r"out of memory in the optimizer step of step 3: a smaller "
                       r"micro-batch does not lower it") as err:
        train(job.replace(optimizer_impl="foreach"),
              RunOptions(out_dir=tmp_path / "o", max_steps=4, save_every_steps=1))
    assert "optimizer_impl: fused" in err.value.hint and "--resume" in err.value.hint
    assert calls["n"] == 3  # not retried
    state = json.loads((tmp_path / "o" / "checkpoint-2" / "trainer_state.json").read_text())
    assert state["step"] == 2 and not (tmp_path / "o" / "checkpoint-3").exists()


def test_the_peak_after_an_oom_split_is_the_running_micro_batches(job, tmp_path, limit_between):
    """An audit: the logged peak held the failed attempt's, above --memory-limit (the refused
    tensor counted), for the rest of the run.  The limit is checked before the peak, and the
    peak starts again at a split: every logged peak is under the limit and equals a run at the
    split's micro-batch."""
    limit = limit_between(job, fits=2, ooms=4)
    res = train(job, RunOptions(out_dir=tmp_path / "m", max_steps=3, memory_limit_bytes=limit))
    assert [e.to_dict()["micro_batch_after"] for e in res.oom_events] == [2]
    rows = [json.loads(x) for x in (tmp_path / "m" / "monitor.jsonl").read_text().splitlines()]
    peaks = {r["peak_allocated_bytes"] for r in rows if r.get("step")}
    assert peaks and max(peaks) <= limit
    train(job.replace(micro_batch=2), RunOptions(out_dir=tmp_path / "t", max_steps=3,
                                                 memory_limit_bytes=limit))
    rows2 = [json.loads(x) for x in (tmp_path / "t" / "monitor.jsonl").read_text().splitlines()]
    assert max(peaks) == max(r["peak_allocated_bytes"] for r in rows2 if r.get("step"))


def test_an_interrupt_during_an_evaluation_stops_at_its_step(job, tmp_path, monkeypatch):
    """An audit: a SIGINT that landed in the step-3 evaluation let step 4 train and saved
    checkpoint-4; the run stops at the evaluation's step, checkpointed there."""
    import os
    import signal

    from trainfit.run import loop

    real = loop.ev.evaluate

    def interrupted(*a, **k):
        out = real(*a, **k)
        if k.get("step") == 2:
            os.kill(os.getpid(), signal.SIGINT)
        return out

    monkeypatch.setattr(loop.ev, "evaluate", interrupted)
    res = train(job, RunOptions(out_dir=tmp_path / "e", max_steps=5, eval_fraction=0.25,
                                eval_every_steps=2))
    assert res.interrupted and res.steps == 2
    assert [Path(c).name for c in res.checkpoints] == ["checkpoint-2"]
