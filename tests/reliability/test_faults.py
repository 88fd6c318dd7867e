"""Faults around a checkpointing run — a full disk, a read-only disk, a second run on the same
directory, flipped bits in every checkpoint file, a bad ``latest``, a diverging loss — each one
``error:`` line (or the documented exit code), nothing half-written, the last good checkpoint and
the logs intact, and the run resumable to the uninterrupted run's losses.

Where the test may mount a filesystem (root, ``mount`` present) the disk is a real small or
read-only tmpfs; the same faults are also injected (the write raises ``OSError(ENOSPC)`` /
``OSError(EROFS)``), which runs everywhere.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import random
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from reliability_tools import tree, write_job

from trainfit.run import checkpoint as ckpt

STEPS = 4


@pytest.fixture(scope="module")
def files(micro_chat_files, tmp_path_factory):
    """(job file, the uninterrupted run's losses over STEPS steps)."""
    from trainfit.job import JobSpec
    from trainfit.run.loop import RunOptions, train

    cfg, data = micro_chat_files
    d = tmp_path_factory.mktemp("faults")
    job = write_job(d / "job.yaml", cfg, data)
    ref = train(JobSpec.from_yaml(job), RunOptions(out_dir=d / "ref", max_steps=STEPS))
    return job, ref.losses


def _train(cli, job, out, *more):
    return cli("train", job, "--out", out, "--max-steps", STEPS, "--save-every", 1, "--no-live",
               *more)


@contextlib.contextmanager
def tmpfs(path: Path, options: str):
    """A real tmpfs at ``path`` (skips the test where it cannot be mounted)."""
    path.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a filesystem needs root")
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)],
                       capture_output=True, text=True)
    if r.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


def _remount(path: Path, options: str) -> None:
    subprocess.run(["mount", "-o", f"remount,{options}", str(path)], check=True)


def _intact(run: Path, step: int) -> None:
    """The last good checkpoint is whole and named by ``latest``; no partial save is left."""
    assert ckpt.damage(run / f"checkpoint-{step}") is None
    assert (run / "latest").read_text().strip() == f"checkpoint-{step}"
    assert not list(run.glob(".checkpoint-*.tmp"))


# --- a full disk ------------------------------------------------------------------------------

def test_disk_full_injected(cli, files, tmp_path, monkeypatch):
    """The save of checkpoint-2 hits ENOSPC half-way through optimizer.pt."""
    import torch

    job, ref = files
    real_save = torch.save

    def save(obj, f, *a, **k):
        if Path(f).name == "optimizer.pt" and Path(f).parent.name == ".checkpoint-2.tmp":
            Path(f).write_bytes(b"\0" * 1000)  # a partial file, as a full disk leaves it
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(f))
        return real_save(obj, f, *a, **k)

    monkeypatch.setattr(torch, "save", save)
    run = tmp_path / "run"
    r = _train(cli, job, run)
    assert r.clean_error(), r.stderr
    assert "No space left on device" in r.errors[0] and "checkpoint-2" in r.errors[0]
    assert "checkpoint-1" in r.errors[0] and "--resume" in r.hints[0]
    _intact(run, 1)
    d = json.loads((run / "train.json").read_text())
    assert d["stopped"] == "failed" and d["losses"] == ref[:2]  # the record of what ran
    lines = (run / "monitor.jsonl").read_text().splitlines()
    assert lines and all(json.loads(x) for x in lines)
    monkeypatch.setattr(torch, "save", real_save)
    r = _train(cli, job, run, "--resume", run)
    assert r.code == 0, r.stderr
    assert json.loads((run / "train.json").read_text())["losses"] == pytest.approx(ref, rel=1e-6)
    assert len((run / "monitor.jsonl").read_text().splitlines()) > len(lines)  # appended


def test_disk_full_small_filesystem(cli, files, tmp_path):
    """A real 3 MiB filesystem: checkpoints of ~1.5 MB each; the second one does not fit."""
    job, ref = files
    with tmpfs(tmp_path / "small", "size=3m") as fs:
        run = fs / "run"
        r = _train(cli, job, run)
        assert r.clean_error(), r.stderr
        assert "No space left on device" in r.errors[0] or "space" in r.hints[0]
        good = int((run / "latest").read_text().strip().rsplit("-", 1)[1])
        _intact(run, good)
        lines = len((run / "monitor.jsonl").read_text().splitlines())
        # resumed in place on the still-full disk: the same clean error, no line of the log lost
        r = _train(cli, job, run, "--resume", run)
        assert r.clean_error(), r.stderr
        _intact(run, good)
        assert len((run / "monitor.jsonl").read_text().splitlines()) >= lines
        _remount(fs, "size=12m")  # space freed: the run continues to the same losses
        r = _train(cli, job, run, "--resume", run)
        assert r.code == 0, r.stderr
        assert json.loads((run / "train.json").read_text())["losses"] == \
            pytest.approx(ref, rel=1e-6)


# --- a read-only disk -------------------------------------------------------------------------

def test_read_only_out_injected(cli, files, tmp_path, monkeypatch):
    job, _ = files
    real_mkdir = Path.mkdir

    def mkdir(self, *a, **k):
        if "ro" in self.parts:
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(self))
        return real_mkdir(self, *a, **k)

    monkeypatch.setattr(Path, "mkdir", mkdir)
    r = _train(cli, job, tmp_path / "ro" / "run")
    assert r.clean_error() and "Read-only file system" in r.errors[0], r.stderr
    assert not (tmp_path / "ro").exists()


def test_read_only_filesystem(cli, files, tmp_path):
    """--out on a read-only disk; a run resumed in place after its disk became read-only;
    tune --out into it — each one line, exit 2, nothing changed."""
    job, _ = files
    with tmpfs(tmp_path / "disk", "size=16m") as fs:
        r = cli("train", job, "--out", fs / "run", "--max-steps", 2, "--save-every", 1,
                "--no-live")
        assert r.code == 0, r.stderr
        _remount(fs, "ro")
        before = tree(fs)
        r = cli("train", job, "--out", fs / "run", "--max-steps", 4, "--resume", fs / "run",
                "--no-live")
        assert r.clean_error() and "Read-only file system" in r.errors[0], r.stderr
        r = cli("train", job, "--out", fs / "new", "--max-steps", 2, "--no-live")
        assert r.clean_error() and "Read-only file system" in r.errors[0], r.stderr
        t0 = time.monotonic()
        r = cli("tune", job, "--out", fs / "t.yaml", "--memory-limit", "1GiB")
        assert r.clean_error() and "--out" in r.errors[0], r.stderr
        assert time.monotonic() - t0 < 30  # refused before the search (which takes minutes)
        assert tree(fs) == before


def test_tune_out_unwritable_is_checked_before_the_search(cli, files, tmp_path, monkeypatch):
    """(the injected variant) the write probe fails: refused before any probe ran."""
    import tempfile

    import trainfit.tune.tuner as tuner

    job, _ = files
    (tmp_path / "locked").mkdir()

    def refuse(*a, **k):
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES))

    monkeypatch.setattr(tempfile, "mkstemp", refuse)
    monkeypatch.setattr(tuner, "tune", lambda *a, **k: pytest.fail("the search ran"))
    r = cli("tune", job, "--out", tmp_path / "locked" / "t.yaml")
    assert r.clean_error() and "Permission denied" in r.errors[0], r.stderr


# --- two runs, one directory ------------------------------------------------------------------

def test_second_run_on_a_directory_is_refused_and_sigterm_exits_143(cli, files, tmp_path):
    import multiprocessing

    from killable import PRELOAD, run_cli

    job, _ = files
    run, log = tmp_path / "run", tmp_path / "a.log"
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)
    a = ctx.Process(target=run_cli, args=(["train", str(job), "--out", str(run), "--max-steps",
                                           "100000", "--save-every", "3", "--no-live", "--json"],
                                          str(log)))
    a.start()
    try:
        deadline = time.monotonic() + 60
        while not (run / "latest").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert (run / "latest").exists(), log.read_text()[-2000:]
        lines = len((run / "monitor.jsonl").read_text().splitlines())
        for extra in ([], ["--resume", str(run)]):
            r = _train(cli, job, run, *extra)
            assert r.clean_error(), r.stderr
            assert f"pid {a.pid}" in r.errors[0] and "another trainfit run" in r.errors[0]
        assert len((run / "monitor.jsonl").read_text().splitlines()) >= lines
    finally:
        a.terminate()  # SIGTERM: the step ends, a checkpoint is saved, exit 143
        a.join(60)
    assert a.exitcode == 143, log.read_text()[-2000:]
    d = json.loads((run / "train.json").read_text())
    assert d["stopped"] == "interrupted" and d["signal"] == "SIGTERM"
    _intact(run, d["steps"])
    # the lock went with its process: the run continues
    r = cli("train", job, "--out", run, "--max-steps", d["steps"] + 1, "--resume", run, "--no-live")
    assert r.code == 0, r.stderr


def test_existing_run_is_not_overwritten(cli, files, tmp_path):
    job, _ = files
    run = tmp_path / "run"
    assert cli("train", job, "--out", run, "--max-steps", 1, "--no-live").code == 0
    before = tree(run)
    r = cli("train", job, "--out", run, "--max-steps", 2, "--no-live")
    assert r.clean_error() and "already holds a run" in r.errors[0], r.stderr
    assert f"--resume {run}" in r.hints[0]
    assert tree(run) == before


# --- damaged checkpoints ----------------------------------------------------------------------

@pytest.fixture(scope="module")
def two_checkpoints(files, tmp_path_factory):
    """A run of STEPS steps stopped after step 2 (checkpoint-1, checkpoint-2)."""
    from trainfit.job import JobSpec
    from trainfit.run.loop import RunOptions, train

    job, _ = files
    run = tmp_path_factory.mktemp("ck") / "run"
    res = train(JobSpec.from_yaml(job), RunOptions(out_dir=run, max_steps=STEPS, save_every_steps=1,
                                                   inject_interrupt_at_step=1))
    assert res.interrupted and res.steps == 2
    return run


def test_a_bit_flipped_in_any_checkpoint_file_is_refused(cli, files, two_checkpoints, tmp_path):
    """One bit flipped at a seeded random place of each file of the newest checkpoint: the resume
    names the file, exits 2, offers checkpoint-1 (which does resume), and writes nothing."""
    job, _ = files
    rng = random.Random(16)
    names = sorted(p.name for p in (two_checkpoints / "checkpoint-2").iterdir())
    assert set(names) >= {"model.safetensors", "optimizer.pt", "scheduler.pt", "rng.pt",
                          "trainer_state.json", "digests.json"}
    for name in names:
        run = tmp_path / name / "run"
        shutil.copytree(two_checkpoints, run)
        f = run / "checkpoint-2" / name
        raw = bytearray(f.read_bytes())
        i = rng.randrange(len(raw))
        raw[i] ^= 1 << rng.randrange(8)
        f.write_bytes(bytes(raw))
        before = tree(run)
        r = cli("train", job, "--out", run, "--max-steps", 3, "--resume", run, "--no-live")
        assert r.clean_error(), (name, r.stderr)
        assert name in r.errors[0], (name, r.errors)
        assert f"--resume {run / 'checkpoint-1'}" in r.hints[0], (name, r.hints)
        assert tree(run) == before, name
    r = cli("train", job, "--out", run, "--max-steps", 3, "--resume", run / "checkpoint-1",
            "--no-live")
    assert r.code == 0, r.stderr


@pytest.mark.parametrize("latest", ["", "checkpoint-9\n", None, "../../etc\n"])
def test_bad_latest_resumes_from_the_newest_complete_checkpoint(cli, files, two_checkpoints,
                                                                 tmp_path, latest):
    job, ref = files
    run = tmp_path / "run"
    shutil.copytree(two_checkpoints, run)
    if latest is None:
        (run / "latest").unlink()
    else:
        (run / "latest").write_text(latest)
    r = cli("train", job, "--out", run, "--max-steps", STEPS, "--resume", run, "--no-live")
    assert r.code == 0, r.stderr
    assert "resuming from checkpoint-2, the newest complete checkpoint" in r.stdout
    d = json.loads((run / "train.json").read_text())
    assert d["segments"][-1]["start_step"] == 2 and "latest" in d["segments"][-1]["notes"][0]
    assert d["losses"] == pytest.approx(ref, rel=1e-6)


def test_an_empty_latest_names_the_damaged_checkpoint_it_passes_over(cli, files, two_checkpoints,
                                                                     tmp_path):
    """QA: with ``latest`` empty and the newest checkpoint damaged, the resume fell back one
    checkpoint and said only that ``latest`` was empty: the damaged one, whose steps are trained
    again, is named."""
    job, ref = files
    run = tmp_path / "run"
    shutil.copytree(two_checkpoints, run)
    (run / "latest").write_text("")
    opt = run / "checkpoint-2" / "optimizer.pt"
    opt.write_bytes(opt.read_bytes()[:-7])
    r = cli("train", job, "--out", run, "--max-steps", STEPS, "--resume", run, "--no-live")
    assert r.code == 0, r.stderr
    assert "resuming from checkpoint-1, the newest complete checkpoint" in r.stdout
    assert "checkpoint-2/optimizer.pt" in r.stdout and "trained again" in r.stdout
    assert json.loads((run / "train.json").read_text())["losses"] == pytest.approx(ref, rel=1e-6)


def test_killed_during_the_first_checkpoint(cli, files, tmp_path):
    """Only a partial ``.checkpoint-1.tmp``: resuming says so; a new start removes it."""
    job, ref = files
    run = tmp_path / "run"
    (run / ".checkpoint-1.tmp").mkdir(parents=True)
    (run / ".checkpoint-1.tmp" / "model.safetensors").write_bytes(b"\0" * 100)
    (run / "monitor.jsonl").write_text('{"time_s": 0.5, "step": 1}\n{"time_s": 1.0, "st')
    r = _train(cli, job, run, "--resume", run)
    assert r.clean_error() and "no complete checkpoint" in r.errors[0], r.stderr
    assert ".checkpoint-1.tmp" in r.errors[0] and "without --resume" in r.hints[0]
    r = _train(cli, job, run)
    assert r.code == 0, r.stderr
    assert "removed .checkpoint-1.tmp" in r.stdout
    assert json.loads((run / "train.json").read_text())["losses"] == pytest.approx(ref, rel=1e-6)
    # the dead run's monitor log is kept beside the new run's, which starts its own (appended,
    # the two read as one timeline whose steps went back: an audit)
    assert "monitor.jsonl of a run that stopped before its first checkpoint set aside as " \
        "monitor.previous.jsonl" in r.stdout
    assert (run / "monitor.previous.jsonl").read_text() == \
        '{"time_s": 0.5, "step": 1}\n{"time_s": 1.0, "st'
    lines = (run / "monitor.jsonl").read_text().splitlines()
    assert lines and all(isinstance(json.loads(x), dict) for x in lines)  # none of the cut log


# --- a diverging loss, an fp16 GradScaler -----------------------------------------------------

def test_nan_loss_stops_with_the_last_good_checkpoint(cli, micro_model_json, chat_jsonl, tmp_path):
    job = write_job(tmp_path / "job.yaml", micro_model_json, chat_jsonl, lr=1e30)
    run = tmp_path / "run"
    r = _train(cli, job, run)
    assert r.code == 3 and len(r.errors) == 1 and len(r.hints) == 1, r.stderr
    assert "non-finite" in r.errors[0] and "checkpoint-1" in r.errors[0]
    d = json.loads((run / "train.json").read_text())
    assert d["stopped"] == "diverged" and d["diverged_at_step"] == 2 and len(d["losses"]) == 1
    _intact(run, 1)
    assert not (run / "checkpoint-2").exists()
    # what it says to do can be done: the job file's lr, a new run (train has no --lr, and a
    # resume keeps the checkpoint's lr), not a resume of checkpoint-1, which led to the step
    assert "lr" in r.hints[0] and "new --out" in r.hints[0] and "--resume" not in r.hints[0]


def test_a_run_stopped_before_its_first_save_is_not_sent_to_resume(cli, micro_model_json,
                                                                    chat_jsonl, tmp_path):
    """The same divergence with no checkpoint yet: running into the directory again is refused
    (its train.json stays), and the hint names what works — a new --out or removing it — where
    it named --resume, which refuses a directory without a checkpoint."""
    job = write_job(tmp_path / "job.yaml", micro_model_json, chat_jsonl, lr=1e30)
    run = tmp_path / "run"
    assert cli("train", job, "--out", run, "--max-steps", STEPS, "--save-every", 100,
               "--no-live").code == 3
    assert not list(run.glob("checkpoint-*"))
    r = cli("train", job, "--out", run, "--max-steps", STEPS, "--no-live")
    assert r.clean_error() and "already holds a run" in r.errors[0], r.stderr
    assert "no checkpoint to continue from" in r.hints[0] and "--resume" not in r.hints[0]
    r = cli("train", job, "--out", run, "--max-steps", STEPS, "--no-live", "--resume", run)
    assert r.clean_error() and "no complete checkpoint" in r.errors[0], r.stderr
    assert "new --out" in r.hints[0]


def test_gradscaler_skipped_steps_are_counted_not_divergence(micro_model_json, chat_jsonl,
                                                             tmp_path, monkeypatch):
    import torch

    import trainfit.model.runtime as runtime
    from trainfit.job import JobSpec
    from trainfit.run.loop import RunOptions, train

    # a loss scale so large that every fp16 gradient overflows: the scaler skips each update
    monkeypatch.setattr(runtime, "scaler_for",
                        lambda job, device: torch.amp.GradScaler("cpu", init_scale=2.0**40))
    job = JobSpec(model=str(micro_model_json), seq_len=32, effective_batch=8, micro_batch=4,
                  precision="amp-fp16", data=str(chat_jsonl))
    res = train(job, RunOptions(out_dir=tmp_path / "run", max_steps=3))
    assert res.scaler_skipped_steps == 3 and res.stopped == "finished" and res.exit_code == 0
    assert len(res.losses) == 3 and all(x == x for x in res.losses)
    assert json.loads((tmp_path / "run" / "train.json").read_text())["scaler_skipped_steps"] == 3

