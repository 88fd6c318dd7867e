"""The run's checkpoint, written: every rank gathers under FSDP, rank 0 writes the checkpoint, prunes
the older ones under --keep-last and writes train.json beside it; a failure on any rank is every
rank's (a half-saved run must not go on as if saved). Out of run/loop.py, which drives when."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING

from trainfit.job import JobError
from trainfit.run import checkpoint as ckpt
from trainfit.run.record import TrainResult, write_train_json

if TYPE_CHECKING:
    from trainfit.run.loop import Trainer


def still_there(paths: list[str], out_dir: Path) -> list[str]:
    """The record's checkpoints that exist now: each as this run directory's checkpoint of that
    name where it has one (a run directory moved or copied, then resumed: its record's paths
    are the old directory's — an audit found 4 of 5 listed gone under --keep-last), else as
    written where that still is (a run resumed from another run's checkpoint keeps that one),
    else left out (pruned or deleted)."""
    kept = []
    for c in paths:
        here = out_dir / Path(c).name
        if here.is_dir():
            kept.append(str(here))
        elif Path(c).is_dir():
            kept.append(c)
    return list(dict.fromkeys(kept))


def save_checkpoint(tr: Trainer, res: TrainResult) -> None:
    """Save ``tr``'s state at its step, with the record so far inside the checkpoint."""
    # under FSDP gathering the full state is collective: every rank saves, rank 0 writes
    main = tr.dist.rank == 0
    err: JobError | None = None
    if main or tr.dist.shards(tr.job.sharding):
        job = tr.job.replace(micro_batch=tr.state.micro_batch,
                             effective_batch=tr.job.effective_batch).to_dict()
        name = str(tr.o.out_dir / f"checkpoint-{tr.state.step}")
        elapsed_s = time.perf_counter() - tr.t_start
        history = res.snapshot(elapsed_s)
        history["checkpoints"] = [*history["checkpoints"], name]
        try:
            p = ckpt.save(tr.o.out_dir, tr.state, tr.wl.model, tr.wl.optimizer,
                          tr.scheduler, tr.wl.scaler, job, write=main, history=history,
                          schedule_steps=tr.run_steps)
            if main:
                res.checkpoints.append(str(p))
                if tr.o.keep_last is not None:  # --keep-last: the older ones go
                    ckpt.prune(tr.o.out_dir, tr.o.keep_last, upto_step=tr.state.step)
                # the record lists what is there (a review: a resumed snapshot's list named
                # checkpoints an earlier prune had removed)
                res.checkpoints = still_there(res.checkpoints, tr.o.out_dir)
                write_train_json(tr.o.out_dir, res, open_wall_time_s=elapsed_s)
        except ckpt.CheckpointWriteError as e:
            err = e
        except OSError as e:  # train.json beside a checkpoint that was written
            err = JobError(f"could not write {tr.o.out_dir / 'train.json'} "
                           f"({e.strerror}); the checkpoint {name} is intact",
                           f"free space on that disk, then --resume {tr.o.out_dir}")
    if tr.dist.any(err is not None):
        raise err or JobError("rank 0 could not write the checkpoint", "see rank 0's error")
    tr.last_saved_step = tr.state.step
    tr.dist.barrier()
