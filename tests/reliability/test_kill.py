"""SIGKILL at seeded random moments of a checkpointing run (a checkpoint after every step, so most
kills land inside a save): after each kill the run directory holds a complete checkpoint whose
record equals the uninterrupted run's, the lock is free, monitor.jsonl has lost no line, and the
run resumed from it — through ≥ 10 kills — ends with exactly the uninterrupted run's losses."""

from __future__ import annotations

import json
import multiprocessing
import random
import time
from pathlib import Path

import pytest
from killable import PRELOAD, run_cli

from trainfit.job import JobError
from trainfit.run import checkpoint as ckpt

STEPS = 60
KILLS = 12
SEED = 16
WAIT_S = 120  # the longest a segment may take to write its first new checkpoint (a slow, busy CI)


@pytest.fixture(scope="module")
def forkserver():
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)
    return ctx


def _start(ctx, args, log):
    p = ctx.Process(target=run_cli, args=(args, str(log)))
    p.start()
    return p


def _newest_step(out: Path) -> int:
    """The highest N of a renamed (so complete or being verified) ``checkpoint-N`` directory."""
    steps = [int(d.name.rsplit("-", 1)[1]) for d in out.glob("checkpoint-*") if d.is_dir()]
    return max(steps, default=0)


def _wait_for_progress(p, out: Path, after_step: int) -> None:
    """Until the process has saved a checkpoint past ``after_step`` (or exited): kills are timed
    by the run's own progress, not by the wall clock, so a slow machine gets as many kills."""
    t0 = time.monotonic()
    while p.exitcode is None and time.monotonic() - t0 < WAIT_S:
        if out.exists() and _newest_step(out) > after_step:
            return
        p.join(0.02)


def _join_within_steps(p, out: Path, wait_s: float, steps: int = 2) -> None:
    """Wait ``wait_s`` for ``p``, or less once it has saved ``steps`` checkpoints past the newest
    one now: a step timed slow on a busy machine does not let a quiet segment run far past the
    kill moment, so the run keeps its ≥ 10 kills whatever the load did to ``step_s``."""
    start = _newest_step(out) if out.exists() else 0
    deadline = time.monotonic() + wait_s
    while p.exitcode is None and time.monotonic() < deadline:
        if out.exists() and _newest_step(out) >= start + steps:
            return
        p.join(min(0.01, max(0.0, deadline - time.monotonic())))


def _lines(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


def test_sigkill_at_random_moments_loses_nothing(forkserver, job_file, tmp_path):
    base = ["train", str(job_file), "--max-steps", str(STEPS), "--save-every", "1", "--no-live",
            "--json"]
    ref_out = tmp_path / "ref"
    p = _start(forkserver, [*base, "--out", str(ref_out)], tmp_path / "ref.log")
    # this machine's time for a step and its save, measured on the uninterrupted run (it sets the
    # kill moments below: a machine 5× slower or faster gets the same kills per step)
    _wait_for_progress(p, ref_out, 4)
    t_first = time.monotonic()
    _wait_for_progress(p, ref_out, STEPS - 6)
    step_s = (time.monotonic() - t_first) / (STEPS - 10)
    p.join(120)
    assert p.exitcode == 0, (tmp_path / "ref.log").read_text()[-3000:]
    ref = json.loads((ref_out / "train.json").read_text())["losses"]
    assert len(ref) == STEPS

    out, log = tmp_path / "run", tmp_path / "run.log"
    rng = random.Random(SEED)
    kills, resumed, in_save = 0, 0, 0
    monitor_lines = 0
    while True:
        has_ck = out.exists() and bool(ckpt.checkpoints(out))
        args = [*base, "--out", str(out), *(["--resume", str(out)] if has_ck else [])]
        resumed += has_ck
        p = _start(forkserver, args, log)
        if kills >= KILLS:
            p.join(120)  # the last segment runs to the end
            assert p.exitcode == 0, log.read_text()[-3000:]
            break
        # a random moment within the next two steps (and their saves) once this segment has saved
        # a checkpoint of its own; on the first start, sometimes before any (the resume then has
        # nothing and says so)
        if kills or rng.random() < 0.8:
            _wait_for_progress(p, out, _newest_step(out) if out.exists() else 0)
        _join_within_steps(p, out, rng.uniform(0.0, 2 * step_s))
        if p.exitcode is not None:  # finished before the kill: the run is complete
            assert p.exitcode == 0, log.read_text()[-3000:]
            break
        p.kill()  # SIGKILL
        p.join(30)
        if p.exitcode == 0:  # it finished in the instant between the wait and the kill
            break
        assert p.exitcode == -9, log.read_text()[-3000:]
        kills += 1
        in_save += bool(list(out.glob(".checkpoint-*.tmp")))  # killed while writing one
        # after the kill: a complete checkpoint whose record is the reference's prefix, or (killed
        # before the first one) a clear message; no line of monitor.jsonl lost
        try:
            ck, _note = ckpt.find(out)
        except JobError as err:
            assert "no complete checkpoint" in str(err) or "does not exist" in str(err)
        else:
            h = ckpt.history(ck)
            step = int(ck.name.rsplit("-", 1)[1])
            assert h["losses"] == ref[:step], f"kill {kills}: record of {ck.name} differs"
        n = _lines(out / "monitor.jsonl")
        assert n >= monitor_lines
        monitor_lines = n
    d = json.loads((out / "train.json").read_text())
    assert kills >= 10, f"only {kills} kills before the run finished"
    assert d["losses"] == ref  # bit-identical: same process settings, same order of sums
    assert d["steps"] == STEPS and d["samples_seen"] == STEPS * 8 and d["stopped"] == "finished"
    assert sum(s["steps"] for s in d["segments"]) >= STEPS
    assert d["segments"][-1]["end_step"] == STEPS
    assert ckpt.damage(out / f"checkpoint-{STEPS}") is None
    assert not list(out.glob(".checkpoint-*.tmp"))
    print(f"\nSIGKILL: {kills} kills ({in_save} inside a save), {resumed} resumes from a "
          "checkpoint, final losses equal "
          f"the uninterrupted run's ({STEPS} steps), {len(d['segments'])} segments recorded")
