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
DEADLINE_S = 90  # the loop stops starting new kills after this (CI budget); ≥ 10 are required


@pytest.fixture(scope="module")
def forkserver():
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)
    return ctx


def _start(ctx, args, log):
    p = ctx.Process(target=run_cli, args=(args, str(log)))
    p.start()
    return p


def _lines(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


def test_sigkill_at_random_moments_loses_nothing(forkserver, job_file, tmp_path):
    base = ["train", str(job_file), "--max-steps", str(STEPS), "--save-every", "1", "--no-live",
            "--json"]
    ref_out = tmp_path / "ref"
    p = _start(forkserver, [*base, "--out", str(ref_out)], tmp_path / "ref.log")
    p.join(120)
    assert p.exitcode == 0, (tmp_path / "ref.log").read_text()[-3000:]
    ref = json.loads((ref_out / "train.json").read_text())["losses"]
    assert len(ref) == STEPS

    out, log = tmp_path / "run", tmp_path / "run.log"
    rng = random.Random(SEED)
    kills, resumed, in_save, t0 = 0, 0, 0, time.monotonic()
    monitor_lines = 0
    while True:
        has_ck = out.exists() and bool(ckpt.checkpoints(out))
        args = [*base, "--out", str(out), *(["--resume", str(out)] if has_ck else [])]
        resumed += has_ck
        p = _start(forkserver, args, log)
        if kills >= KILLS or time.monotonic() - t0 > DEADLINE_S:
            p.join(120)  # the last segment runs to the end
            assert p.exitcode == 0, log.read_text()[-3000:]
            break
        p.join(rng.uniform(0.15, 1.0))  # start-up ~0.3 s, then a step and its save every ~0.1 s
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
    assert kills >= 10, f"only {kills} kills before the deadline"
    assert d["losses"] == ref  # bit-identical: same process settings, same order of sums
    assert d["steps"] == STEPS and d["samples_seen"] == STEPS * 8 and d["stopped"] == "finished"
    assert sum(s["steps"] for s in d["segments"]) >= STEPS
    assert d["segments"][-1]["end_step"] == STEPS
    assert ckpt.damage(out / f"checkpoint-{STEPS}") is None
    assert not list(out.glob(".checkpoint-*.tmp"))
    print(f"\nSIGKILL: {kills} kills ({in_save} inside a save), {resumed} resumes from a "
          "checkpoint, final losses equal "
          f"the uninterrupted run's ({STEPS} steps), {len(d['segments'])} segments recorded")
