"""``trainfit train JOB.yaml``: parse → :func:`trainfit.run.loop.train` (or torchrun with --nproc)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from trainfit.cli.jobargs import fail, parse_bytes
from trainfit.job import JobError, JobSpec, read_job_file


def _check_nproc(nproc: int, device: str) -> None:
    import torch

    if nproc < 1:
        raise JobError(f"--nproc {nproc}: must be ≥ 1")
    if device.startswith("cuda"):
        n = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if nproc > n:
            raise JobError(f"--nproc {nproc}: only {n} CUDA device(s) here",
                           f"use --nproc ≤ {n}, or several nodes through torchrun's rendezvous")
    elif nproc > (os.cpu_count() or 1):
        raise JobError(f"--nproc {nproc}: only {os.cpu_count()} CPU cores here",
                       f"use --nproc ≤ {os.cpu_count()}")


def _launch(nproc: int, device: str, job: JobSpec, job_file: str) -> int:
    """``--nproc N``: the same command under torchrun, N ranks (the exit code of torchrun)."""
    _check_nproc(nproc, device)
    if job.ranks != nproc:
        raise JobError(f"--nproc {nproc} but the job says ranks {job.ranks}",
                       f"set ranks: {nproc} in {job_file} (the effective batch is "
                       "global: micro × accumulation × ranks)")
    args = [a for a in sys.argv[1:] if not a.startswith("--nproc")]
    if "--nproc" in sys.argv:
        i = sys.argv.index("--nproc")
        args = sys.argv[1:i] + sys.argv[i + 2:]
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc}",
           "-m", "trainfit.cli.main", *args]
    return subprocess.call(cmd)


def _steps(text: str | None) -> tuple[int, ...]:
    """A fault drill's steps, comma-separated."""
    return tuple(int(s) for s in text.split(",")) if text else ()


def register(app: typer.Typer) -> None:
    @app.command("train")
    def train_cmd(
        job_file: Annotated[str, typer.Argument(help="The job YAML (what trainfit tune wrote).")],
        out: Annotated[str, typer.Option(help="Run directory: checkpoints, train.json, "
                                              "monitor.jsonl.")] = "trainfit-run",
        max_steps: Annotated[int | None, typer.Option(help="Optimizer steps to run.")] = None,
        epochs: Annotated[float, typer.Option(help="Epochs when --max-steps is not given.")] = 1.0,
        save_every: Annotated[int | None, typer.Option(help="Checkpoint every N steps.")] = None,
        resume: Annotated[str | None, typer.Option(
            help="Run directory or checkpoint to resume from (another micro-batch is allowed).")] = None,
        device: Annotated[str | None, typer.Option(help="cpu, cuda or cuda:N")] = None,
        memory_limit: Annotated[str | None, typer.Option(
            help="CPU stand-in for a GPU's capacity (OOM path, as tune).")] = None,
        micro_batch: Annotated[int | None, typer.Option(
            help="Override the micro-batch (the effective batch is kept).")] = None,
        nproc: Annotated[int, typer.Option(help="Processes (ranks) through torchrun.")] = 1,
        live: Annotated[bool | None, typer.Option(
            "--live/--no-live", help="Live view (default: on a terminal).")] = None,
        inject_oom_at: Annotated[str | None, typer.Option(
            help="Fault drill: steps (comma-separated) whose forward raises an OOM once.")] = None,
        eval_data: Annotated[str | None, typer.Option(
            help="Evaluation set: a file read and tokenized as the training data.")] = None,
        eval_fraction: Annotated[float | None, typer.Option(
            help="Hold out this fraction of the training samples (by seed) to evaluate on; they "
                 "are not trained on.")] = None,
        eval_every: Annotated[int | None, typer.Option(
            help="Evaluate every N optimizer steps (and always at the end).")] = None,
        eval_batch: Annotated[int | None, typer.Option(
            help="Evaluation batch per rank (default: the micro-batch; halved on OOM).")] = None,
        inject_eval_oom_at: Annotated[str | None, typer.Option(
            help="Fault drill: steps (comma-separated) whose evaluation raises an OOM once.")] = None,
        allow_offload: Annotated[bool, typer.Option(
            help="Accept modules offloaded to cpu/disk by a device map.")] = False,
        backend: Annotated[str | None, typer.Option(
            help="trainfit (own loop: every guarantee, any model), hf (transformers Trainer), trl "
                 "(SFTTrainer), auto (trl for chat rows, hf for text); default: the file's "
                 "backend: key, else trainfit.")] = None,
        as_json: Annotated[bool, typer.Option("--json")] = False,
    ) -> None:
        """Run the job: watched live, checkpointed, surviving OOM and interruption."""
        from trainfit.run.backend import run_backend
        from trainfit.run.loop import RunOptions

        try:
            fields, extra = read_job_file(job_file)
            if micro_batch is not None:
                fields["micro_batch"] = micro_batch
                fields.pop("grad_accum", None)
            job = JobSpec.from_dict(fields, source=job_file)
            dev = device or str(extra.get("device") or "cpu")
            if resume is not None and not Path(resume).exists():
                raise JobError(f"--resume {resume}: does not exist",
                               "give the run directory of an earlier trainfit train")
            if nproc > 1 and "WORLD_SIZE" not in os.environ:
                raise typer.Exit(_launch(nproc, dev, job, job_file))
            opts = RunOptions(out_dir=Path(out), max_steps=max_steps, epochs=epochs,
                              save_every_steps=save_every,
                              resume=Path(resume) if resume else None, device=dev,
                              memory_limit_bytes=parse_bytes(memory_limit, "--memory-limit"),
                              live=live, allow_offload=allow_offload,
                              inject_oom_at_steps=_steps(inject_oom_at),
                              eval_data=Path(eval_data) if eval_data else None,
                              eval_fraction=eval_fraction, eval_every_steps=eval_every,
                              eval_batch=eval_batch,
                              inject_eval_oom_at_steps=_steps(inject_eval_oom_at))
            result = run_backend(job, opts, backend or str(extra.get("backend") or "trainfit"))
        except JobError as err:
            fail(err)
            return
        d: dict[str, Any] = result.to_dict()
        if as_json:
            typer.echo(json.dumps(d, indent=1))
            return
        from trainfit.render.train import render_train

        render_train(d, out)
